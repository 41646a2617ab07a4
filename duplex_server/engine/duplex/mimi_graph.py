"""Mimi streamed at static shapes, so that a tick's encode and decode are
each captured once as a CUDA graph and replayed.

``MimiStreamEncoder`` and ``MimiStreamDecoder`` (mimi_stream) stream
through transformers' caches: a ``DynamicCache`` that grows until the codec
transformer's window fills, padding caches replaced every call, masks as
long as the stream. Every tick has other shapes, and costs a few hundred
kernel launches from Python each way: 19-35 ms of a tick at Moshi's real
codec size, whatever the batch. Here the same computation keeps all its
state in tensors allocated once and updated in place:

- each causal convolution's left context, a ``[rows, channels, padding]``
  tail (the encoder's replicate-padded downsample takes a fresh row's from
  its first input, as transformers' padding cache does, through a per-row
  ``fresh`` flag);
- each transposed convolution's overlap into the next frame, a tail too;
- the codec transformer's keys and values, a ring of ``window + n - 1``
  slots (``n`` positions a tick: the transformer runs at twice the frame
  rate) with each slot's own position per row, so that each query sees the
  newest ``window`` positions of its own row, as transformers' sliding
  mask does. Attention is order-free, so the ring's order does not matter.

A row resets in place between ticks; a row rebuilt by the eager stepper (a
resume) is adopted from its ``MimiStreamEncoder`` / ``MimiStreamDecoder``.
On CUDA, encode and decode are graphs (``Replay``); elsewhere the same code
runs eagerly, which is what the CPU tests compare with the eager streamers
frame by frame.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from transformers import DynamicCache
from transformers.models.mimi.modeling_mimi import (
    MimiConv1d,
    MimiConvTranspose1d,
    MimiModel,
    MimiResnetBlock,
    MimiTransformerModel,
    apply_rotary_pos_emb,
)

from duplex_server.engine.duplex.mimi_stream import (
    MimiStreamDecoder,
    MimiStreamEncoder,
    check_streamable_conv,
    check_streamable_transpose,
    decoder_half,
    decoder_layer,
    encoder_half,
)
from duplex_server.engine.duplex.replay import Replay
from duplex_server.engine.duplex.timeline import RowTimeline


class _Ring:
    """A Mimi transformer over a ring-buffer KV cache, ``per_tick`` positions a call."""

    def __init__(
        self, transformer: MimiTransformerModel, rows: int, per_tick: int, like: torch.Tensor
    ) -> None:
        config = transformer.config
        window = config.sliding_window
        if not isinstance(window, int) or window < 1:
            raise ValueError("a Mimi transformer without a sliding_window cannot stream here")
        self.transformer = transformer
        self.window = window
        self.size = window + per_tick - 1
        heads, dim = int(config.num_key_value_heads or 0), int(config.head_dim or 0)
        self.keys = like.new_zeros(config.num_hidden_layers, rows, heads, self.size, dim)
        self.values = torch.zeros_like(self.keys)
        device = like.device
        # each slot's position in its row's own stream; -1: empty
        self.own = torch.full((rows, self.size), -1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)  # each row's next
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # the next slot written
        self.offsets = torch.arange(per_tick, device=device)

    def reset(self, row: int) -> None:
        self.own[row] = -1
        self.positions[row] = 0

    def adopt(self, row: int, cache: DynamicCache, timeline: RowTimeline) -> None:
        """Row 0 of an eager streamer's cache into ``row``: its newest keys
        and values at the slots just before the next write."""
        self.reset(row)
        own = timeline.length - int(timeline.start[0])
        written = False
        for index, layer in enumerate(cache.layers):
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if keys is None or values is None or not own:
                continue
            stored = min(own, keys.shape[-2], self.window - 1)
            slots = (int(self.slot) - stored + torch.arange(stored)) % self.size
            slots = slots.to(self.keys.device)
            self.keys[index, row].index_copy_(1, slots, keys[0, :, -stored:])
            self.values[index, row].index_copy_(1, slots, values[0, :, -stored:])
            if not written:
                positions = own - stored + torch.arange(stored, device=self.own.device)
                self.own[row].index_copy_(0, slots, positions)
                written = True
        self.positions[row] = own

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, per_tick, channels) through the transformer; the ring moves on."""
        transformer = self.transformer
        rows, n = hidden.shape[:2]
        slots = (self.slot + self.offsets) % self.size
        positions = self.positions[:, None] + self.offsets
        self.own.index_copy_(1, slots, positions)
        seen, query = self.own[:, None, :], positions[:, :, None]
        mask = ((seen >= 0) & (seen <= query) & (seen > query - self.window))[:, None]
        cos, sin = transformer.rotary_emb(hidden, positions)
        layers: list[Any] = list(transformer.layers)
        for index, layer in enumerate(layers):
            attn = layer.self_attn
            h = layer.input_layernorm(hidden)
            shape = (rows, n, -1, attn.head_dim)
            q = attn.q_proj(h).view(shape).transpose(1, 2)
            k = attn.k_proj(h).view(shape).transpose(1, 2)
            v = attn.v_proj(h).view(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            self.keys[index].index_copy_(2, slots, k)
            self.values[index].index_copy_(2, slots, v)
            out = F.scaled_dot_product_attention(
                q,
                self.keys[index],
                self.values[index],
                attn_mask=mask,
                scale=attn.scaling,
                enable_gqa=attn.num_key_value_groups > 1,
            )
            out = attn.o_proj(out.transpose(1, 2).reshape(rows, n, -1))
            hidden = hidden + layer.self_attn_layer_scale(out)
            mlp = layer.mlp(layer.post_attention_layernorm(hidden))
            hidden = hidden + layer.mlp_layer_scale(mlp)
        self.positions.add_(n)
        self.slot.add_(n).remainder_(self.size)
        return hidden


def _first_parameter(mimi: MimiModel) -> torch.Tensor:
    return next(mimi.parameters())


class GraphMimiEncoder:
    """``MimiStreamEncoder``'s interface (reset, adopt, encode) at static shapes."""

    def __init__(
        self, mimi: MimiModel, rows: int, num_codebooks: int, *, graphs: bool | None = None
    ) -> None:
        encoder = encoder_half(mimi)
        seanet = encoder.encoder_seanet
        if encoder.downsample is None:
            raise ValueError("Mimi without a downsampling layer cannot stream its encoder")
        convs = [seanet.get_submodule(name) for name in seanet._conv1d_layer_names]
        convs.append(encoder.downsample)
        like = _first_parameter(mimi)
        self.mimi = mimi
        self.num_codebooks = num_codebooks
        self.tails: dict[int, torch.Tensor] = {}  # id(conv) -> its left context
        for conv in convs:
            if not isinstance(conv, MimiConv1d) or conv.pad_mode not in ("constant", "replicate"):
                raise ValueError(f"Mimi encoder layer {conv!r} cannot stream here")
            self.tails[id(conv)] = like.new_zeros(rows, conv.in_channels, int(conv.padding_total))
        self.fresh = torch.ones(rows, dtype=torch.bool, device=like.device)
        self.ring = _Ring(
            encoder.encoder_transformer, rows, int(encoder.downsample.conv.stride[0]), like
        )
        self.use_graph = like.device.type == "cuda" if graphs is None else graphs
        self._replay = Replay(self._encode)

    def reset(self, row: int) -> None:
        self.fresh[row] = True
        self.ring.reset(row)

    def adopt(self, row: int, source: MimiStreamEncoder) -> None:
        """Continue ``source``'s row 0 (a stream rebuilt alone) in ``row``."""
        self.ring.adopt(row, source.cache, source.timeline)
        padding = source.padding
        ran = all(tail is not None for tail in padding.padding_cache)
        if not ran or any(0 in pending for pending in padding.pending):
            self.fresh[row] = True  # it saw no input since its start
            return
        for tail, source_tail in zip(self.tails.values(), padding.padding_cache, strict=True):
            if source_tail is not None:
                tail[row] = source_tail[0]
        self.fresh[row] = False

    def encode(self, samples: torch.Tensor) -> torch.Tensor:
        """(rows, 1920) samples -> (rows, num_codebooks) codes."""
        run = self._replay if self.use_graph else self._encode
        (codes,) = run(samples)
        return codes

    def _encode(self, samples: torch.Tensor) -> tuple[torch.Tensor]:
        encoder = encoder_half(self.mimi)
        hidden = samples[:, None, :].to(self.mimi.dtype)
        for layer in encoder.encoder_seanet.layers:
            hidden = self._layer(layer, hidden)
        hidden = self.ring(hidden.transpose(1, 2)).transpose(1, 2)
        downsample = encoder.downsample
        assert downsample is not None  # checked at construction
        latents = self._conv(downsample, hidden)
        codes = self.mimi.quantizer.encode(latents, self.num_codebooks).transpose(0, 1)
        self.fresh.zero_()
        return (codes[:, :, 0],)

    def _layer(self, layer: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if isinstance(layer, MimiConv1d):
            return self._conv(layer, hidden)
        if isinstance(layer, MimiResnetBlock):
            residual = hidden
            for inner in layer.block:
                hidden = self._layer(inner, hidden)
            shortcut = layer.shortcut
            if isinstance(shortcut, MimiConv1d):
                if int(shortcut.padding_total):
                    raise ValueError("a Mimi shortcut convolution with a context cannot stream")
                return shortcut.conv(residual) + hidden
            return shortcut(residual) + hidden
        return layer(hidden)

    def _conv(self, conv: MimiConv1d, hidden: torch.Tensor) -> torch.Tensor:
        """A causal convolution fed its left context (a fresh row's: zeros, or
        its first input repeated for replicate padding)."""
        tail = self.tails[id(conv)]
        padding = tail.shape[-1]
        if not padding:
            return conv.conv(hidden)
        if conv.pad_mode == "replicate":
            start = hidden[..., :1].expand_as(tail)
        else:
            start = torch.zeros_like(tail)
        left = torch.where(self.fresh[:, None, None], start, tail)
        padded = torch.cat([left, hidden], dim=-1)
        tail.copy_(padded[..., -padding:])
        return conv.conv(padded)


class GraphMimiDecoder:
    """``MimiStreamDecoder``'s interface (reset, adopt, decode) at static shapes."""

    def __init__(self, mimi: MimiModel, rows: int, *, graphs: bool | None = None) -> None:
        decoder = decoder_half(mimi)
        like = _first_parameter(mimi)
        self.mimi = mimi
        self.tails: dict[int, torch.Tensor] = {}  # id(layer) -> its carried context
        for layer in decoder.modules():
            if isinstance(layer, MimiConv1d):
                check_streamable_conv(layer)
                padding = int(layer.padding_total)
                if padding:
                    self.tails[id(layer)] = like.new_zeros(rows, layer.in_channels, padding)
            elif isinstance(layer, MimiConvTranspose1d):
                check_streamable_transpose(layer)
                conv = layer.conv
                overlap = conv.kernel_size[0] - conv.stride[0]
                self.tails[id(layer)] = like.new_zeros(rows, conv.out_channels, overlap)
        upsample = decoder.upsample
        per_tick = 1 if upsample is None else upsample.conv.stride[0]
        self.ring = _Ring(decoder.decoder_transformer, rows, per_tick, like)
        self.use_graph = like.device.type == "cuda" if graphs is None else graphs
        self._replay = Replay(self._decode)

    def reset(self, row: int) -> None:
        """A fresh stream: zero left context, nothing carried over."""
        for tail in self.tails.values():
            tail[row] = 0
        self.ring.reset(row)

    def adopt(self, row: int, source: MimiStreamDecoder) -> None:
        """Continue ``source``'s row 0 (a stream rebuilt alone) in ``row``."""
        self.ring.adopt(row, source.cache, source.timeline)
        for layer, tail in self.tails.items():
            carried = source.state.get(layer)
            tail[row] = 0 if carried is None else carried[0]

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """(rows, num_codebooks) codes -> (rows, samples per frame)."""
        run = self._replay if self.use_graph else self._decode
        (samples,) = run(codes)
        return samples

    def _decode(self, codes: torch.Tensor) -> tuple[torch.Tensor]:
        decoder = decoder_half(self.mimi)
        hidden = self.mimi.quantizer.decode(codes[:, :, None])
        if decoder.upsample is not None:
            hidden = self._transpose(decoder.upsample, hidden)
        hidden = self.ring(hidden.transpose(1, 2)).transpose(1, 2)
        for layer in decoder.decoder_seanet.layers:
            hidden = self._layer(layer, hidden)
        return (hidden[:, 0, :],)

    def _layer(self, layer: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return decoder_layer(layer, hidden, self._conv, self._transpose)

    def _conv(self, layer: MimiConv1d, hidden: torch.Tensor) -> torch.Tensor:
        tail = self.tails.get(id(layer))
        if tail is None:
            return layer.conv(hidden)
        padded = torch.cat([tail, hidden], dim=-1)
        tail.copy_(padded[..., -tail.shape[-1] :])
        return layer.conv(padded)

    def _transpose(self, layer: MimiConvTranspose1d, hidden: torch.Tensor) -> torch.Tensor:
        """The overlap carried in from the last frame added, this frame's kept for the next."""
        out = layer.conv(hidden)
        tail = self.tails[id(layer)]
        overlap = tail.shape[-1]
        out = torch.cat([out[..., :overlap] + tail, out[..., overlap:]], dim=-1)
        emitted = hidden.shape[-1] * layer.conv.stride[0]
        carried = out[..., emitted:]
        if layer.conv.bias is not None:  # the next frame's own outputs add the bias once
            carried = carried - layer.conv.bias[None, :, None]
        tail.copy_(carried)
        return out[..., :emitted]
