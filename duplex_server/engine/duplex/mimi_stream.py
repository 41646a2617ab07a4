"""Mimi streamed one 80 ms frame at a time over a batch of rows.

Encode goes through ``MimiModel.encode(..., use_streaming=True)``: its
causal convolutions keep their left context in a padding cache and its
transformer a KV cache, which makes frame-by-frame encoding equal to one
encode of the whole signal. Decode has no such mode: ``MimiModel.decode``
of one frame pads every causal convolution with zeros instead of the
previous frame's tail and drops the overlap its transposed convolutions
would add to the next frame. ``MimiStreamDecoder`` walks the decoder's
layers itself and keeps both, so frame-by-frame decoding equals one decode
of all frames.

Rows restart independently (``reset``): their convolution state is zeroed
(or re-initialised from their first input, for replicate padding) and their
transformer positions restart behind a mask (``RowTimeline``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache
from transformers.models.mimi.modeling_mimi import (
    MimiConv1d,
    MimiConv1dPaddingCache,
    MimiConvTranspose1d,
    MimiDecoderModel,
    MimiEncoderModel,
    MimiModel,
    MimiResnetBlock,
)

from duplex_server.engine.duplex.splice import splice_row
from duplex_server.engine.duplex.timeline import RowTimeline


class RowPaddingCache(MimiConv1dPaddingCache):
    """Mimi's padding cache, with rows that restart: a reset row's cache is
    re-initialised from its next input, as a fresh stream's would be."""

    def __init__(self, mimi: MimiModel) -> None:
        encoder = encoder_half(mimi)
        names = encoder.encoder_seanet._conv1d_layer_names
        modules = [encoder.encoder_seanet.get_submodule(name) for name in names]
        layers = [
            layer for layer in [*modules, encoder.downsample] if isinstance(layer, MimiConv1d)
        ]
        if len(layers) != len(names) + 1:
            raise ValueError("Mimi without a downsampling layer cannot stream its encoder")
        super().__init__(
            num_layers=len(layers),
            per_layer_padding=[int(layer.padding_total) for layer in layers],
            per_layer_padding_mode=[layer.pad_mode for layer in layers],
            per_layer_in_channels=[layer.in_channels for layer in layers],
        )
        self.pending: list[set[int]] = [set() for _ in layers]

    def reset(self, row: int) -> None:
        for pending in self.pending:
            pending.add(row)

    def update(self, hidden_states: torch.Tensor, layer_idx: int) -> torch.Tensor:
        rows = sorted(self.pending[layer_idx])
        self.pending[layer_idx].clear()
        cache = self.padding_cache[layer_idx]
        if rows and cache is not None:
            fresh = self._cache_init(hidden_states[rows], layer_idx)
            cache = cache.clone()
            cache[rows] = fresh
            self.padding_cache[layer_idx] = cache
        return super().update(hidden_states, layer_idx)


class MimiStreamEncoder:
    """Each row's newest frame of samples in, its frame of codes out."""

    def __init__(self, mimi: MimiModel, rows: int, num_codebooks: int) -> None:
        self.mimi = mimi
        self.num_codebooks = num_codebooks
        self.padding = RowPaddingCache(mimi)
        self.cache = DynamicCache(config=encoder_half(mimi).config)
        # the SEANet encoder halves the frame rate once more in `downsample`
        self.timeline = RowTimeline(rows, 2, mimi.device)

    def reset(self, row: int) -> None:
        self.padding.reset(row)
        self.timeline.reset(row)

    def adopt(self, row: int, source: MimiStreamEncoder) -> None:
        """Continue ``source``'s row 0 (a stream rebuilt alone) in ``row``."""
        splice_row(self.cache, self.timeline, row, source.cache, source.timeline)
        caches = self.padding.padding_cache
        for layer, tail in enumerate(source.padding.padding_cache):
            if tail is None:
                continue  # the source saw no input: the row stays fresh
            self.padding.pending[layer].discard(row)
            if caches[layer] is None:  # rows that never ran start from their first input
                caches[layer] = tail.new_zeros(self.timeline.start.shape[0], *tail.shape[1:])
                self.padding.pending[layer].update(r for r in range(len(caches[layer])) if r != row)
            caches[layer][row] = tail[0]

    def encode(self, samples: torch.Tensor) -> torch.Tensor:
        """(rows, 1920) samples -> (rows, num_codebooks) codes."""
        return self.encode_frames(samples)[:, :, 0]

    def encode_frames(self, samples: torch.Tensor) -> torch.Tensor:
        """(rows, frames * 1920) samples -> (rows, num_codebooks, frames) codes:
        the stream's next frames in one call (a prefill), as frame by frame."""
        frames = samples.shape[-1] // self.mimi.config.frame_size
        mask, positions = self.timeline.step_inputs(frames)
        out = self.mimi.encode(
            samples[:, None, :].to(self.mimi.dtype),
            num_quantizers=self.num_codebooks,
            encoder_cache=self.cache,
            padding_cache=self.padding,
            use_streaming=True,
            attention_mask=mask,
            position_ids=positions,
        )
        self.timeline.advance(frames)
        return out.audio_codes


class MimiStreamDecoder:
    """Each row's frame of codes in, its 1920 samples out, exactly as a full decode."""

    def __init__(self, mimi: MimiModel, rows: int) -> None:
        self.mimi = mimi
        self.half = decoder = decoder_half(mimi)
        upsample = decoder.upsample
        self.upsample_factor = 1 if upsample is None else upsample.conv.stride[0]
        self.cache = DynamicCache(config=decoder.config)
        self.timeline = RowTimeline(rows, self.upsample_factor, mimi.device)
        self.state: dict[int, torch.Tensor] = {}  # id(layer) -> that layer's carried tail
        self.rows = rows
        for layer in decoder.modules():
            if isinstance(layer, MimiConv1d):
                check_streamable_conv(layer)
            elif isinstance(layer, MimiConvTranspose1d):
                check_streamable_transpose(layer)

    def reset(self, row: int) -> None:
        """Forget the row's carried tails (zero is a fresh stream's left padding)."""
        for tail in self.state.values():
            tail[row] = 0
        self.timeline.reset(row)

    def adopt(self, row: int, source: MimiStreamDecoder) -> None:
        """Continue ``source``'s row 0 (a stream rebuilt alone) in ``row``."""
        splice_row(self.cache, self.timeline, row, source.cache, source.timeline)
        for layer, tail in source.state.items():
            mine = self.state.get(layer)
            if mine is None:
                mine = self.state[layer] = tail.new_zeros(self.rows, *tail.shape[1:])
            mine[row] = tail[0]

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """(rows, num_codebooks) codes -> (rows, samples per frame)."""
        return self.decode_frames(codes[:, :, None])

    def decode_frames(self, codes: torch.Tensor) -> torch.Tensor:
        """(rows, num_codebooks, frames) codes -> (rows, frames * samples per
        frame): the stream's next frames in one call (a prefill)."""
        decoder = self.half
        frames = codes.shape[-1]
        hidden = self.mimi.quantizer.decode(codes)
        if decoder.upsample is not None:
            hidden = self._transpose(decoder.upsample, hidden)
        mask, positions = self.timeline.step_inputs(frames)
        hidden = decoder.decoder_transformer(
            hidden.transpose(1, 2),
            attention_mask=mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
        ).last_hidden_state.transpose(1, 2)
        self.timeline.advance(frames)
        for layer in decoder.decoder_seanet.layers:
            hidden = self._layer(layer, hidden)
        return hidden[:, 0, :]

    def _layer(self, layer: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return decoder_layer(layer, hidden, self._conv, self._transpose)

    def _conv(self, layer: MimiConv1d, hidden: torch.Tensor) -> torch.Tensor:
        """A causal convolution fed the previous frames' last inputs as its left padding."""
        padding = int(layer.padding_total)
        if padding == 0:
            return layer.conv(hidden)
        tail = self.state.get(id(layer))
        if tail is None:
            tail = hidden.new_zeros(hidden.shape[0], hidden.shape[1], padding)
        padded = torch.cat([tail, hidden], dim=-1)
        self.state[id(layer)] = padded[..., -padding:].clone()
        return layer.conv(padded)

    def _transpose(self, layer: MimiConvTranspose1d, hidden: torch.Tensor) -> torch.Tensor:
        """A transposed convolution whose overlap into the next frame is carried over."""
        out = layer.conv(hidden)
        stride = layer.conv.stride[0]
        emitted = hidden.shape[-1] * stride
        tail = self.state.get(id(layer))
        if tail is not None:
            out = out.clone()
            out[..., : tail.shape[-1]] += tail
        carried = out[..., emitted:]
        if layer.conv.bias is not None:  # the next frame's own outputs add the bias once
            carried = carried - layer.conv.bias[None, :, None]
        self.state[id(layer)] = carried.clone()
        return out[..., :emitted]


Conv = Callable[[Any, torch.Tensor], torch.Tensor]


def decoder_layer(
    layer: torch.nn.Module, hidden: torch.Tensor, conv: Conv, transpose: Conv
) -> torch.Tensor:
    """One layer of Mimi's SEANet decoder, its convolutions run by a
    streaming codec's own ``conv`` and ``transpose`` (each keeps its state
    its own way: transformers' caches, or static tensors for CUDA graphs)."""
    if isinstance(layer, MimiConv1d):
        return conv(layer, hidden)
    if isinstance(layer, MimiConvTranspose1d):
        return transpose(layer, hidden)
    if isinstance(layer, MimiResnetBlock):
        residual = hidden
        for inner in layer.block:
            hidden = decoder_layer(inner, hidden, conv, transpose)
        return decoder_layer(layer.shortcut, residual, conv, transpose) + hidden
    return layer(hidden)


def encoder_half(mimi: MimiModel) -> MimiEncoderModel:
    if mimi.encoder is None:
        raise ValueError("this Mimi codec has no encoder (encoder_config is null)")
    return mimi.encoder


def decoder_half(mimi: MimiModel) -> MimiDecoderModel:
    if mimi.decoder is None:
        raise ValueError("this Mimi codec has no decoder (decoder_config is null)")
    return mimi.decoder


def check_streamable_conv(layer: MimiConv1d) -> None:
    if layer.causal and int(layer.stride) == 1 and layer.pad_mode == "constant":
        return
    raise ValueError(
        "Mimi decoder convolution is not streamable here: needs causal, stride 1, constant "
        f"padding (got causal={layer.causal}, stride={int(layer.stride)}, "
        f"pad_mode={layer.pad_mode})"
    )


def check_streamable_transpose(layer: MimiConvTranspose1d) -> None:
    if layer.padding_left != 0:
        raise ValueError(
            "Mimi decoder transposed convolution trims on the left (trim_right_ratio != 1): "
            "not streamable here"
        )
