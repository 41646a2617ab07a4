"""``bench sessions --find-capacity``: the search, run against fake servers."""

from __future__ import annotations

from duplex_bench.capacity import Probe, find_capacity, next_count, passes


def server_that_holds(capacity: int, saturates_at: int | None = None):
    """A fake probe: passes up to ``capacity`` sessions; from ``saturates_at``
    on, its generator saturates (and the probe is invalid, whatever the latency)."""
    asked: list[int] = []

    def probe(sessions: int) -> Probe:
        asked.append(sessions)
        invalid = saturates_at is not None and sessions >= saturates_at
        return Probe(sessions, sessions <= capacity and not invalid, {"invalid": invalid})

    return probe, asked


def test_doubling_then_bisection_brackets_the_capacity():
    probe, asked = server_that_holds(137)
    search = find_capacity(probe, start=10, max_probes=20)
    assert asked[:5] == [10, 20, 40, 80, 160]  # doubling until the first failure
    assert search.converged and search.best_pass is not None and search.first_fail is not None
    assert search.best_pass <= 137 < search.first_fail
    assert search.first_fail - search.best_pass <= max(1, int(search.best_pass * 0.05))
    assert [p.sessions for p in search.probes] == asked


def test_a_failing_start_halves_down():
    probe, asked = server_that_holds(30)
    search = find_capacity(probe, start=200, max_probes=20)
    assert asked[:4] == [200, 100, 50, 25]
    assert search.best_pass is not None and search.best_pass <= 30 < search.first_fail


def test_nothing_passes():
    probe, asked = server_that_holds(0)
    search = find_capacity(probe, start=4, max_probes=20)
    assert asked == [4, 2, 1] and search.best_pass is None and search.converged


def test_the_probes_are_bounded():
    probe, asked = server_that_holds(10_000)
    search = find_capacity(probe, start=1, max_probes=5)
    assert asked == [1, 2, 4, 8, 16]
    assert search.best_pass == 16 and search.first_fail is None and not search.converged


def test_an_invalid_probe_is_not_a_pass():
    """The generator saturates at 100 sessions though the server would hold 300:
    the capacity found stays below 100, and the search ends there."""
    probe, _ = server_that_holds(300, saturates_at=100)
    search = find_capacity(probe, start=25, max_probes=20)
    assert search.best_pass is not None and search.best_pass < 100
    assert all(not p.passed for p in search.probes if p.report["invalid"])


def test_next_count():
    assert next_count(10, None, None) == 10
    assert next_count(10, 40, None) == 80
    assert next_count(10, None, 10) == 5
    assert next_count(10, None, 1) is None
    assert next_count(10, 100, 200) == 150
    assert next_count(10, 100, 105) is None  # within 5 %


def phase(p99: float | None, saturated: bool = False, errors: int = 0) -> dict:
    return {
        "commit_to_first_audio_ms": {"p50": None, "p99": p99},
        "generator_saturated": saturated,
        "errors": errors,
        "connect_failures": 0,
    }


def test_a_probe_passes_only_valid_clean_and_under_target():
    assert passes(phase(49.9), 50.0)
    assert not passes(phase(50.0), 50.0)
    assert not passes(phase(None), 50.0)  # no answer audio at all
    assert not passes(phase(10.0, saturated=True), 50.0)
    assert not passes(phase(10.0, errors=1), 50.0)
