"""The batched step of ``DuplexStepper`` without transformers' per-step overheads.

``DuplexStepper`` runs the temporal transformer and the depth decoder
through transformers' modules: about 9,600 small kernel launches a tick at
the 7B shape, and a ``DynamicCache`` that concatenates (copies) every
layer's whole KV cache each step. ``FastDuplexStepper`` computes the same
thing from the same weights (the checkpoint's tensors, not copies) with:

- a static ring-buffer KV cache per layer, ``[rows, kv_heads, window,
  head_dim]`` allocated once and written in place at slot ``length % window``
  (the model's ``sliding_window``: a query sees the newest ``window``
  positions, as transformers' sliding cache does). A per-row ``valid`` mask
  replaces the shared timeline's mask: a (re)joining row clears its slots
  and restarts its RoPE positions at zero, so it attends to what it would
  alone. Attention is order-free, so the ring's order does not matter. A
  resumed row is prefilled by the eager stepper alone and its cache copied
  into the ring (``adopt``);
- the forward written against the weights: RMSNorm in float32 scaled by
  its weight, RoPE (``rotate_half``, the model's ``inv_freq``), the gated
  MLP (``act(first half) * second half``), and the depth decoder's
  per-codebook weights (``MoshiFlexibleLinear``: ``weight[codebook]``) with
  its own small static cache of the frame's codebooks and no RoPE;
- Mimi's streaming encode and decode at static shapes (``mimi_graph``:
  convolution tails and a KV ring updated in place) instead of through
  transformers' growing caches;
- on CUDA, all four (encode, temporal, depth, decode) captured as CUDA
  graphs once the first ticks have run eagerly (cuBLAS and the allocator
  warmed), then replayed: a tick is four graph launches.

Greedy tokens and voice equal ``DuplexStepper``'s (tests compare them
frame by frame on a tiny model on CPU, across the ring's wrap); on bf16
they agree up to the rounding of a different summation order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from transformers import MoshiForConditionalGeneration
from transformers.cache_utils import DynamicLayer

from duplex_server.engine.duplex.mimi_graph import GraphMimiDecoder, GraphMimiEncoder
from duplex_server.engine.duplex.replay import WARMUP_CALLS, Replay
from duplex_server.engine.duplex.sampling import AUDIO_TOP_K, Draw, choose
from duplex_server.engine.duplex.stepper import Decoder, DuplexStepper, Encoder
from duplex_server.engine.duplex.tokens import FrameTokens, PrimeFrame


def _rms(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """``MoshiRMSNorm``: normalised in float32, scaled by its weight, cast back."""
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + norm.eps)
    return (y * norm.weight.float()).type_as(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _gated_mlp(
    x: torch.Tensor, act: Callable, fc1: torch.Tensor, fc2: torch.Tensor
) -> torch.Tensor:
    """``MoshiGatingMLP``: fc1, then act(first half) times the second half, then fc2."""
    h = F.linear(x, fc1).view(x.shape[0], 2, -1)
    return F.linear(act(h[:, 0]) * h[:, 1], fc2)


class FastDuplexStepper(DuplexStepper):
    """``DuplexStepper`` with a ring-buffer KV cache, a hand-written forward
    and (on CUDA, unless ``graphs=False``) CUDA graphs; same interface."""

    def __init__(
        self,
        model: MoshiForConditionalGeneration,
        rows: int,
        *,
        graphs: bool | None = None,
        graphed_codec: bool = True,
    ) -> None:
        window = model.config.sliding_window
        if not isinstance(window, int) or window < 1:
            raise ValueError("the fast step needs a checkpoint with a sliding_window")
        self.window = window
        self._allocated = False
        self.keys = self.values = self.depth_keys = self.depth_values = torch.empty(0)
        self.valid = self.positions = self.slot = torch.empty(0)
        self.forced_mask = self.forced_codes = torch.empty(0)
        self.greedy_inverse = self.greedy_noise = torch.empty(0)
        self.use_graphs = model.device.type == "cuda" if graphs is None else graphs
        self._temporal_replay = Replay(self._temporal)
        self._depth_replay = Replay(self._depth)
        self.graphed_codec = graphed_codec
        self._graphed: tuple[GraphMimiEncoder, GraphMimiDecoder] | None = None
        super().__init__(model, rows)

    # --- state -----------------------------------------------------------------

    def _fresh_state(self) -> None:
        super()._fresh_state()
        if self._allocated:  # in place: the captured graphs keep these addresses
            self.valid.zero_()
            self.positions.zero_()
            self.slot.zero_()
            return
        config: Any = self.model.config
        depth: Any = self.model.depth_decoder.config
        device, dtype = self.model.device, self.model.dtype
        rows, k = self.rows, self.num_codebooks
        ring = (config.num_hidden_layers, rows, config.num_key_value_heads, self.window)
        self.keys = torch.zeros(*ring, config.head_dim, device=device, dtype=dtype)
        self.values = torch.zeros_like(self.keys)
        self.valid = torch.zeros(rows, self.window, dtype=torch.bool, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        frame = (depth.num_hidden_layers, rows, depth.num_key_value_heads, k, depth.head_dim)
        self.depth_keys = torch.zeros(*frame, device=device, dtype=dtype)
        self.depth_values = torch.zeros_like(self.depth_keys)
        self.forced_mask = torch.zeros(rows, dtype=torch.bool, device=device)
        self.forced_codes = torch.zeros(rows, k, dtype=torch.long, device=device)
        self.greedy_inverse = torch.ones(rows, dtype=torch.float32, device=device)
        self.greedy_noise = torch.zeros(rows, k, self.audio_vocab, device=device)
        self._allocated = True

    def _codec(self) -> tuple[Encoder, Decoder]:
        """Mimi at static shapes (``mimi_graph``; graphed where the step is),
        kept across a fresh start (the graphs hold its addresses), unless
        ``graphed_codec`` is off."""
        if not self.graphed_codec:
            return super()._codec()
        if self._graphed is None:
            mimi, graphs = self.model.audio_encoder, self.use_graphs
            self._graphed = (
                GraphMimiEncoder(mimi, self.rows, self.num_codebooks, graphs=graphs),
                GraphMimiDecoder(mimi, self.rows, graphs=graphs),
            )
        else:
            for row in range(self.rows):
                self._graphed[0].reset(row)
                self._graphed[1].reset(row)
        return self._graphed

    def join(self, prefix: Sequence[PrimeFrame] = ()) -> int:
        if prefix:  # primed in an eager batch of one, then adopted (below)
            return self.resume([], prefix)
        row = super().join()
        self.valid[row] = False
        self.positions[row] = 0
        return row

    @torch.no_grad()
    def adopt(self, alone: DuplexStepper) -> int:
        """Take a free row for row 0 of an eager batch of one and copy its
        state in: its cached keys and values into the ring, at the slots
        that make the newest one the slot just before this batch's next
        write, marked valid; its RoPE position, codec state, next column."""
        source = 0
        row = self.join()
        self._adopt_columns(row, alone)
        own = alone.timeline.length - int(alone.timeline.start[source])
        for index, layer in enumerate(alone.cache.layers):
            if not isinstance(layer, DynamicLayer):
                raise TypeError(f"cannot adopt a {type(layer).__name__} cache layer")
            keys, values = layer.keys, layer.values
            if keys is None or values is None or not own:
                continue
            stored = min(own, keys.shape[-2], self.window - 1)
            slots = (self.timeline.length - stored + torch.arange(stored)) % self.window
            slots = slots.to(self.keys.device)
            self.keys[index, row].index_copy_(1, slots, keys[source, :, -stored:])
            self.values[index, row].index_copy_(1, slots, values[source, :, -stored:])
            self.valid[row].index_fill_(0, slots, True)
        self.positions[row] = own
        return row

    @torch.no_grad()
    def capture(self) -> None:
        """Capture the graphs now: the warm-up ticks and the capture run on
        silence with every row live, then the batch is emptied (its next
        join starts it afresh, in place). A server calls this at load, so
        that no session's tick pays for a capture, and none is captured
        while a rebuild runs on another thread. Without graphs: nothing."""
        if not self.use_graphs or any(self.live):
            return
        rows = [self.join() for _ in range(self.rows)]
        silence = np.zeros(self.frame_samples, dtype=np.float32)
        for _ in range(WARMUP_CALLS + 1):
            self.tick(dict.fromkeys(rows, silence))
        for row in rows:
            self.leave(row)

    # --- the step ----------------------------------------------------------------

    def _temporal_step(self, user_column: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        run = self._temporal_replay if self.use_graphs else self._temporal
        hidden, logits = run(self.text_in, self.audio_in, user_column)
        self.timeline.advance()
        return hidden, logits

    def _depth_step(
        self,
        hidden: torch.Tensor,
        text: torch.Tensor,
        forced: dict[int, FrameTokens],
        noise: Draw | None,
    ) -> torch.Tensor:
        self.forced_mask.zero_()
        for row, tokens in forced.items():
            self.forced_mask[row] = True
            self.forced_codes[row] = torch.tensor(tokens.audio, dtype=torch.long)
        if forced and all(self.live[row] == (row in forced) for row in range(self.rows)):
            return self.forced_codes.clone()  # a pure prefill tick: nothing to choose
        run = self._depth_replay if self.use_graphs else self._depth
        if noise is None:  # greedy rows: 1 / T is 1, no noise (static inputs of the graph)
            inverse, audio = self.greedy_inverse, self.greedy_noise
        else:
            inverse, audio = noise.inverse_temperature, noise.audio
        (codes,) = run(hidden, text, self.forced_mask, self.forced_codes, inverse, audio)
        return codes

    def _temporal(
        self, text_in: torch.Tensor, audio_in: torch.Tensor, user_column: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One position of the temporal transformer for every row, into the ring."""
        model, k = self.model, self.num_codebooks
        x = model.decoder.model.embed_tokens(text_in)
        for codebook in range(k):  # the eager stepper's order of additions
            x = x + model.embed_tokens[codebook](audio_in[:, codebook])
            x = x + model.embed_tokens[k + codebook](user_column[:, codebook])
        self.valid.index_fill_(1, self.slot, True)
        mask = self.valid[:, None, None, :]
        cos, sin = self._rope()
        for index, layer in enumerate(model.decoder.model.layers):
            x = x + self._attend(
                index, layer.self_attn, _rms(x, layer.input_layernorm), mask, cos, sin
            )
            mlp = layer.mlp
            h = _rms(x, layer.post_attention_layernorm)
            x = x + _gated_mlp(h, mlp.activation_fn, mlp.fc1.weight, mlp.fc2.weight)
        hidden = _rms(x, model.decoder.model.norm)
        logits = F.linear(hidden, model.decoder.lm_head.weight)
        self.positions.add_(1)
        self.slot.add_(1).remainder_(self.window)
        return hidden, logits

    def _rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        rotary = self.model.decoder.model.layers[0].self_attn.rotary_emb
        freqs = self.positions[:, None].float() * rotary.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = rotary.attention_scaling
        dtype = self.model.dtype
        return (emb.cos() * scale).to(dtype)[:, None, None], (emb.sin() * scale).to(dtype)[
            :, None, None
        ]

    def _attend(
        self,
        index: int,
        attn: Any,
        h: torch.Tensor,
        mask: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        rows, dim = h.shape[0], attn.head_dim
        q = F.linear(h, attn.q_proj.linear.weight).view(rows, -1, 1, dim)
        key = F.linear(h, attn.k_proj.linear.weight).view(rows, -1, 1, dim)
        value = F.linear(h, attn.v_proj.linear.weight).view(rows, -1, 1, dim)
        q = q * cos + _rotate_half(q) * sin
        key = key * cos + _rotate_half(key) * sin
        self.keys[index].index_copy_(2, self.slot, key)
        self.values[index].index_copy_(2, self.slot, value)
        out = F.scaled_dot_product_attention(
            q,
            self.keys[index],
            self.values[index],
            attn_mask=mask,
            scale=attn.scaling,
            enable_gqa=attn.num_key_value_groups > 1,
        )
        return F.linear(out.reshape(rows, -1), attn.o_proj.linear.weight)

    def _depth(
        self,
        hidden: torch.Tensor,
        text: torch.Tensor,
        forced_mask: torch.Tensor,
        forced_codes: torch.Tensor,
        inverse_temperature: torch.Tensor,
        noise: torch.Tensor,
    ) -> tuple[torch.Tensor]:
        """The frame's codebooks one by one (``forced_mask`` rows take
        ``forced_codes``; the others choose, greedy rows with ``1 / T`` 1 and
        no noise, which is the argmax)."""
        depth = self.model.depth_decoder
        previous = text
        chosen_all = []
        for codebook in range(self.num_codebooks):
            embed = depth.text_embed_tokens if codebook == 0 else depth.embed_tokens[codebook - 1]
            x = embed(previous) + F.linear(hidden, depth.input_projections.weight[codebook])
            for index, layer in enumerate(depth.layers):
                x = x + self._depth_attend(
                    index, codebook, layer.self_attn, _rms(x, layer.input_layernorm)
                )
                mlp = layer.mlp
                h = _rms(x, layer.post_attention_layernorm)
                x = x + _gated_mlp(
                    h, mlp.activation_fn, mlp.fc1.weight[codebook], mlp.fc2.weight[codebook]
                )
            logits = F.linear(x, depth.lm_heads.weight[codebook])
            picked = choose(logits, inverse_temperature, noise[:, codebook], AUDIO_TOP_K)
            chosen = torch.where(forced_mask, forced_codes[:, codebook], picked)
            chosen_all.append(chosen)
            previous = chosen
        return (torch.stack(chosen_all, dim=1),)

    def _depth_attend(self, index: int, codebook: int, attn: Any, h: torch.Tensor) -> torch.Tensor:
        rows, dim = h.shape[0], attn.head_dim
        q = F.linear(h, attn.q_proj.linear.weight[codebook]).view(rows, -1, 1, dim)
        key = F.linear(h, attn.k_proj.linear.weight[codebook]).view(rows, -1, 1, dim)
        value = F.linear(h, attn.v_proj.linear.weight[codebook]).view(rows, -1, 1, dim)
        self.depth_keys[index, :, :, codebook : codebook + 1] = key
        self.depth_values[index, :, :, codebook : codebook + 1] = value
        out = F.scaled_dot_product_attention(
            q,
            self.depth_keys[index, :, :, : codebook + 1],
            self.depth_values[index, :, :, : codebook + 1],
            scale=attn.scaling,
            enable_gqa=attn.num_key_value_groups > 1,
        )
        return F.linear(out.reshape(rows, -1), attn.o_proj.linear.weight[codebook])


def make_stepper(
    model: MoshiForConditionalGeneration, rows: int, step: str, graphed_codec: bool = True
) -> DuplexStepper:
    """The stepper ``--moshi-step`` names: 'eager' (transformers' modules) or 'fast'
    (``graphed_codec=False``: the fast step with transformers' streaming codec).

    On CUDA either way, PyTorch's cuDNN attention backend is turned off for
    the process: it builds an execution plan per new shape (~8 ms of CPU a
    call on an H200), and Mimi's streaming encoder attends over a KV cache
    that grows every frame until its window fills, so every tick paid it
    (Mimi's encode 84 ms a tick with it, 10 ms without). The flash and
    memory-efficient kernels remain.
    """
    if model.device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
    if step == "fast":
        return FastDuplexStepper(model, rows, graphed_codec=graphed_codec)
    if step == "eager":
        return DuplexStepper(model, rows)
    raise ValueError(f"--moshi-step {step!r}: 'eager' or 'fast'")
