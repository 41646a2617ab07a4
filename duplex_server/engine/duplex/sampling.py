"""How a row of the batched Moshi step picks its tokens: greedily, or at a
temperature, reproducibly.

A row that samples draws its noise from its own seed and its own frame
number, never from the batch or a global generator: the same stream gives
the same tokens alone or beside others, and after a crash a row rebuilt
from its log continues at the frame number the log left it at, so it draws
what the uninterrupted run would have drawn. That is what keeps resume
exact when the model samples.

Gumbel-max: ``argmax(logits / T + G)`` with ``G`` i.i.d. standard Gumbel is
a draw from ``softmax(logits / T)``; restricted to the ``top_k`` largest
logits, as Moshi's reference sampler is (25 for text, 250 for audio). A
greedy row takes ``1 / T`` as 1 and ``G`` as 0, so one function serves both
with static shapes (the fast step captures it in a CUDA graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TEXT_TOP_K = 25
AUDIO_TOP_K = 250
_MIX = 0x9E3779B97F4A7C15  # spreads seeds so that (seed, frame) keys do not collide
_KEYS = 2**63


@dataclass(frozen=True)
class Sampling:
    """A stream's sampling: ``temperature`` 0 is greedy."""

    temperature: float = 0.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


GREEDY = Sampling()


@dataclass(frozen=True)
class Draw:
    """One tick's noise for the whole batch: per row ``1 / T`` (1 for greedy
    rows), text noise ``[rows, text_vocab]`` and audio noise ``[rows,
    codebooks, audio_vocab]`` (zeros for greedy rows)."""

    inverse_temperature: torch.Tensor
    text: torch.Tensor
    audio: torch.Tensor


def choose(
    logits: torch.Tensor, inverse_temperature: torch.Tensor, noise: torch.Tensor, top_k: int
) -> torch.Tensor:
    """Each row's token: the argmax of its top-``top_k`` logits scaled by
    ``1 / T`` plus its noise (``[rows, vocab]`` logits and noise)."""
    scores = logits.float()
    k = min(top_k, scores.shape[-1])
    kth = scores.topk(k, dim=-1).values[:, -1:]
    perturbed = scores * inverse_temperature[:, None] + noise
    return perturbed.masked_fill(scores < kth, float("-inf")).argmax(dim=-1)


def draw(
    sampling: list[Sampling],
    frames: list[int],
    text_vocab: int,
    codebooks: int,
    audio_vocab: int,
    device: torch.device,
) -> Draw | None:
    """The batch's noise for one tick (None when every row is greedy): row
    ``r`` at its frame ``frames[r]`` draws from its own generator."""
    if all(s.greedy for s in sampling):
        return None
    rows, width = len(sampling), text_vocab + codebooks * audio_vocab
    inverse = torch.ones(rows, dtype=torch.float32)
    uniform = torch.full((rows, width), 0.5, dtype=torch.float32, device=device)
    for row, (setting, frame) in enumerate(zip(sampling, frames, strict=True)):
        if setting.greedy:
            continue
        # one generator and one draw a sampling row: its noise is its own
        generator = torch.Generator(device=device)
        generator.manual_seed((setting.seed * _MIX + frame) % _KEYS)
        inverse[row] = 1.0 / setting.temperature
        torch.rand(width, generator=generator, device=device, out=uniform[row])
    noise = gumbel(uniform)
    noise[torch.tensor([s.greedy for s in sampling], device=device)] = 0.0  # greedy rows
    return Draw(
        inverse.to(device),
        noise[:, :text_vocab],
        noise[:, text_vocab:].reshape(rows, codebooks, audio_vocab),
    )


def gumbel(uniform: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise, ``-log(-log(U))``, from uniform draws in [0, 1)."""
    tiny = torch.finfo(uniform.dtype).tiny
    return -torch.log(-torch.log(uniform.clamp(min=tiny, max=1.0 - 2**-24)))
