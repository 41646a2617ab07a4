"""``bench sessions --find-capacity``: the largest session count a server
serves inside the latency target, found in a bounded number of probes.

Pure: the search takes the probe as a function, so a test can run it
against a fake server. It doubles from the start until a probe fails, halves
if the first one fails, then bisects between the largest pass and the
smallest failure until they are within ``RESOLUTION`` of each other or the
probes run out. A probe whose generator saturated is not a pass: it
measured the generator, so it bounds the search like a failure and is
reported as invalid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

RESOLUTION = 0.05  # stop bisecting once the bracket is this fraction of the pass


@dataclass(frozen=True)
class Probe:
    sessions: int
    passed: bool
    report: dict = field(default_factory=dict)


def passes(phase: dict, target_p99_ms: float) -> bool:
    """Valid, every session connected without an error, p99 commit→first-audio under target."""
    p99 = phase["commit_to_first_audio_ms"]["p99"]
    return (
        not phase["generator_saturated"]
        and not phase["errors"]
        and not phase["connect_failures"]
        and p99 is not None
        and p99 < target_p99_ms
    )


def next_count(start: int, best_pass: int | None, first_fail: int | None) -> int | None:
    """The next session count to probe, or None when the search is done."""
    if best_pass is None and first_fail is None:
        return start
    if first_fail is None:
        assert best_pass is not None
        return best_pass * 2
    if best_pass is None:
        return first_fail // 2 or None  # nothing below one session
    if first_fail - best_pass <= max(1, int(best_pass * RESOLUTION)):
        return None
    return (best_pass + first_fail) // 2


@dataclass
class Search:
    start: int
    probes: list[Probe] = field(default_factory=list)
    best_pass: int | None = None
    first_fail: int | None = None

    def next_count(self) -> int | None:
        return next_count(self.start, self.best_pass, self.first_fail)

    @property
    def converged(self) -> bool:
        """Ended because the bracket closed, not because the probes ran out."""
        return self.next_count() is None


def find_capacity(probe: Callable[[int], Probe], start: int, max_probes: int) -> Search:
    """Probe until the bracket closes or ``max_probes`` have run."""
    search = Search(max(1, start))
    while len(search.probes) < max_probes:
        count = search.next_count()
        if count is None:
            break
        result = probe(count)
        search.probes.append(result)
        if result.passed:
            search.best_pass = count
        else:
            search.first_fail = count
    return search
