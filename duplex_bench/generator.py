"""The load generator's own CPU, so a bench can show it measured the server.

Once a generator's event loop is busy most of the time, latencies are the
generator's, not the server's, and the run says so instead of reporting
them as the server's numbers. Most benches run their clients in the bench
process on one loop (``GeneratorCpu``, ``validity``); ``bench sessions``
spreads them over generator processes and judges each of them
(``ProcessCpu``, ``busy_reasons``, ``verdict``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

# Of one core: the generator's event loop is a single thread.
SATURATED_PERCENT = 90.0
# Stricter for the generator processes of `bench sessions`, whose headline
# is a CPU cost: a loop past this already delays the frames it timestamps.
BUSY_LIMIT_PERCENT = 80.0


class GeneratorCpu:
    def __init__(self) -> None:
        self._process = psutil.Process()

    def start(self) -> None:
        """Begin the measured window."""
        self._process.cpu_percent(None)

    def report(self) -> dict:
        """The generator's CPU over the window, and whether it saturated."""
        percent = round(self._process.cpu_percent(None), 1)
        return {
            "generator_cpu_percent": percent,
            "generator_saturated": percent >= SATURATED_PERCENT,
        }


def validity(*phases: dict) -> dict:
    """A run is valid when no phase's generator saturated."""
    saturated = [index for index, phase in enumerate(phases) if phase.get("generator_saturated")]
    return {
        "valid": not saturated,
        "invalid_reason": (
            f"the load generator saturated its core (phase {saturated[0]})" if saturated else None
        ),
    }


@dataclass(frozen=True)
class ProcessCpu:
    """One generator process's CPU time over the measured window."""

    pid: int
    cores: tuple[int, ...] | None  # None: not pinned
    sessions: int
    cpu_s: float
    window_s: float

    @property
    def busy_percent(self) -> float:
        """Of one core, since each process runs one event loop."""
        return 100.0 * self.cpu_s / self.window_s if self.window_s > 0 else 0.0

    def report(self) -> dict:
        return {
            "pid": self.pid,
            "cores": None if self.cores is None else list(self.cores),
            "sessions": self.sessions,
            "cpu_ms": round(self.cpu_s * 1000.0, 1),
            "busy_percent": round(self.busy_percent, 1),
        }


def busy_reasons(phase: str, processes: Sequence[ProcessCpu]) -> list[str]:
    """Why a phase's latencies may be the generators' rather than the server's.

    A process above the limit is one reason; so is a core whose generator
    processes are each under it but together above it (more processes than
    cores), since they then wait for each other."""
    reasons = [
        f"{phase}: generator process {index} was {p.busy_percent:.1f} % busy "
        f"(limit {BUSY_LIMIT_PERCENT:g} %)"
        for index, p in enumerate(processes)
        if p.busy_percent > BUSY_LIMIT_PERCENT
    ]
    per_core: defaultdict[int, list[ProcessCpu]] = defaultdict(list)
    for p in processes:
        if p.cores is not None and len(p.cores) == 1:
            per_core[p.cores[0]].append(p)
    for core, sharing in sorted(per_core.items()):
        total = sum(p.busy_percent for p in sharing)
        if len(sharing) > 1 and total > BUSY_LIMIT_PERCENT:
            reasons.append(
                f"{phase}: core {core} was {total:.1f} % busy with {len(sharing)} "
                f"generator processes (limit {BUSY_LIMIT_PERCENT:g} %)"
            )
    return reasons


def verdict(reasons: list[str]) -> dict:
    """The run's validity fields; ``invalid_reason`` (the first) is what the
    other benches print, ``invalid_reasons`` lists them all."""
    return {
        "valid": not reasons,
        "invalid_reason": reasons[0] if reasons else None,
        "invalid_reasons": reasons,
    }
