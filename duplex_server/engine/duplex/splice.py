"""Moving one row's transformer cache into another batch's cache.

A row rebuilt alone (a teacher-forced prefill in a batch of one) joins a
live batch by having its cached keys and values written into its row of
the batch's cache, right-aligned to the batch's current position, with its
timeline ``start`` set so that everything before its own history is
masked. When the row's history is longer than the batch's timeline, the
whole batch is first moved later in time (left-padded with masked
columns): only relative positions matter, so nobody else's attention
changes.

The layer attributes used here (``keys``, ``values``, ``cumulative_length``,
``sliding_window``) are those of transformers' ``DynamicLayer`` and
``DynamicSlidingWindowLayer``.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from duplex_server.engine.duplex.timeline import RowTimeline


def splice_row(
    target: DynamicCache,
    target_timeline: RowTimeline,
    row: int,
    source: DynamicCache,
    source_timeline: RowTimeline,
) -> None:
    """Write row 0 of ``source`` into ``row`` of ``target``, keeping what it masks masked."""
    history = source_timeline.length - int(source_timeline.start[0])
    if history > target_timeline.length:
        _delay(target, target_timeline, history - target_timeline.length)
    for target_layer, source_layer in zip(
        map(_dynamic, target.layers), map(_dynamic, source.layers), strict=True
    ):
        if not source_layer.is_initialized:
            continue
        source_keys, source_values = _tensors(source_layer)
        if not target_layer.is_initialized:
            _initialise_like(target_layer, source_keys, source_values, target_timeline)
        keys, values = _tensors(target_layer)
        # the source's oldest columns may be masked ones the target has no room for
        stored = min(source_keys.shape[-2], keys.shape[-2])
        if stored:
            keys[row, :, -stored:] = source_keys[0, :, -stored:]
            values[row, :, -stored:] = source_values[0, :, -stored:]
    target_timeline.start[row] = target_timeline.length - history


def _delay(cache: DynamicCache, timeline: RowTimeline, columns: int) -> None:
    """Move every row ``columns`` positions later: new, masked columns at the front."""
    for layer in map(_dynamic, cache.layers):
        if not layer.is_initialized:
            continue
        keys, values = _tensors(layer)
        before = keys.shape[-2]
        after = before + columns
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length += columns
            after = min(layer.cumulative_length, layer.sliding_window - 1)
        layer.keys = _left_pad(keys, after - before)
        layer.values = _left_pad(values, after - before)
    timeline.length += columns
    timeline.start += columns


def _initialise_like(
    layer: DynamicLayer, keys: torch.Tensor, values: torch.Tensor, timeline: RowTimeline
) -> None:
    """A layer that never saw a step, given the batch's (masked) length in zeros."""
    layer.lazy_initialization(keys, values)
    stored = timeline.length
    if isinstance(layer, DynamicSlidingWindowLayer):
        layer.cumulative_length = timeline.length
        stored = min(stored, layer.sliding_window - 1)
    shape = (timeline.start.shape[0], keys.shape[1], stored, keys.shape[-1])
    layer.keys = keys.new_zeros(shape)
    layer.values = values.new_zeros(shape)


def _dynamic(layer: object) -> DynamicLayer:
    if not isinstance(layer, DynamicLayer):
        raise TypeError(f"cannot splice a {type(layer).__name__} cache layer")
    return layer


def _tensors(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    if layer.keys is None or layer.values is None:
        raise ValueError("cache layer holds no tensors")
    return layer.keys, layer.values


def _left_pad(tensor: torch.Tensor, columns: int) -> torch.Tensor:
    if columns <= 0:
        return tensor
    pad = tensor.new_zeros(*tensor.shape[:2], columns, tensor.shape[-1])
    return torch.cat([pad, tensor], dim=-2)
