"""One shared KV timeline for a batch of rows that start at different ticks.

A transformer cache holds every row at the same global positions. A row
that (re)starts at global position ``start`` sees only positions from
``start`` on (an attention-mask column is zero before it) and counts its
own positions from zero (RoPE position ids per row), so its attention is
the one it would compute alone: a late joiner needs no cache surgery, only
a new ``start``.
"""

from __future__ import annotations

import torch


class RowTimeline:
    """Global positions of one transformer cache: ``tokens_per_tick`` each tick."""

    def __init__(self, rows: int, tokens_per_tick: int, device: torch.device) -> None:
        self.tokens_per_tick = tokens_per_tick
        self.length = 0  # global positions already in the cache
        self.start = torch.zeros(rows, dtype=torch.long, device=device)

    def reset(self, row: int) -> None:
        """The row's stream begins at the next tick; earlier positions are masked."""
        self.start[row] = self.length

    def step_inputs(self, ticks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention mask (rows, length + n) and position ids (rows, n) of
        the next ``ticks`` ticks, taken at once (a prefill)."""
        n = self.tokens_per_tick * ticks
        device = self.start.device
        columns = torch.arange(self.length + n, device=device)
        mask = (columns[None, :] >= self.start[:, None]).long()
        positions = columns[None, self.length :] - self.start[:, None]
        return mask, positions

    def advance(self, ticks: int = 1) -> None:
        self.length += self.tokens_per_tick * ticks
