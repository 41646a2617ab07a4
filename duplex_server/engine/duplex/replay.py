"""A function of static-shape tensors captured once as a CUDA graph and replayed."""

from __future__ import annotations

from collections.abc import Callable

import torch

# Eager calls before the graph is captured (they are real calls: cuBLAS,
# cuDNN and the allocator warm up on them).
WARMUP_CALLS = 2


class Replay:
    """``fn`` run eagerly ``WARMUP_CALLS`` times, then captured once as a
    CUDA graph and replayed.

    The function may update state tensors in place (a KV ring, positions,
    convolution tails): capture records those updates without running them,
    every replay runs them. Between calls the caller may change that state
    in place too (a row's reset): the graph reads the same addresses.
    Outputs are cloned: the next replay overwrites the graph's own.
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        self.fn = fn
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list[torch.Tensor] = []
        self.outputs: tuple[torch.Tensor, ...] = ()

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.graph is None and self.calls < WARMUP_CALLS:
            self.calls += 1
            return self.fn(*args)
        if self.graph is None:
            self.inputs = [arg.clone() for arg in args]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.outputs = self.fn(*self.inputs)
            self.graph = graph
        for static, arg in zip(self.inputs, args, strict=True):
            static.copy_(arg)
        self.graph.replay()
        return tuple(out.clone() for out in self.outputs)
