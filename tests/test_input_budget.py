"""The input budget: media admitted at most factor x real time plus a burst,
and at most a session's lifetime of bytes."""

from __future__ import annotations

from duplex_server.sessions.runtime.input_budget import REFUSAL_PAUSE_S, InputBudget


def code(budget: InputBudget, now_s: float) -> str | None:
    refused = budget.refusal(now_s)
    return None if refused is None else refused.code


def test_a_burst_then_real_time_times_the_factor():
    budget = InputBudget(factor=2.0, burst_ms=1000.0, max_bytes=0, now_s=0.0)
    budget.charge(900.0, 0, 0.0)
    assert code(budget, 0.0) is None  # 100 ms of burst left
    budget.charge(500.0, 0, 0.0)  # a big append may overdraw it
    assert code(budget, 0.0) == "rate_limited"
    assert code(budget, 0.2) == "rate_limited"  # 400 ms earned back at 2x: still 0 left
    assert code(budget, 0.21) is None


def test_the_bucket_holds_no_more_than_the_burst():
    budget = InputBudget(factor=2.0, burst_ms=1000.0, max_bytes=0, now_s=0.0)
    budget.charge(1000.0, 0, 3600.0)  # an hour of quiet saves up one burst, not more
    assert code(budget, 3600.0) == "rate_limited"


def test_a_factor_of_zero_lifts_the_rate_bound():
    budget = InputBudget(factor=0.0, burst_ms=0.0, max_bytes=0, now_s=0.0)
    budget.charge(10_000_000.0, 10**12, 0.0)
    assert code(budget, 0.0) is None


def test_a_sessions_lifetime_of_media_is_bounded_however_slowly_sent():
    budget = InputBudget(factor=2.0, burst_ms=1000.0, max_bytes=1000, now_s=0.0)
    budget.charge(10.0, 999, 0.0)
    assert code(budget, 100.0) is None
    budget.charge(10.0, 1, 100.0)
    assert code(budget, 1_000_000.0) == "resource_exhausted"


def test_a_rate_refusal_pauses_reading_the_socket_briefly():
    budget = InputBudget(factor=2.0, burst_ms=100.0, max_bytes=0, now_s=0.0)
    assert budget.read_pause_s(0.0) == 0.0  # nothing refused yet
    budget.charge(100.0, 4800, 0.0)
    assert budget.refusal(0.0) is not None
    assert budget.read_pause_s(0.0) == REFUSAL_PAUSE_S
    assert budget.read_pause_s(REFUSAL_PAUSE_S / 2) == REFUSAL_PAUSE_S / 2
    assert budget.read_pause_s(REFUSAL_PAUSE_S) == 0.0
