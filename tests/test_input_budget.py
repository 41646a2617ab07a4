"""The input budget: media admitted at most factor x real time plus a burst."""

from __future__ import annotations

from duplex_server.sessions.runtime.input_budget import InputBudget


def test_a_burst_then_real_time_times_the_factor():
    budget = InputBudget(factor=2.0, burst_ms=1000.0, now_s=0.0)
    budget.charge(900.0, 0.0)
    assert budget.admits(0.0)  # 100 ms of burst left
    budget.charge(500.0, 0.0)  # a big append may overdraw it
    assert not budget.admits(0.0)
    assert not budget.admits(0.2)  # 400 ms earned back at 2x: still 0 left
    assert budget.admits(0.21)


def test_the_bucket_holds_no_more_than_the_burst():
    budget = InputBudget(factor=2.0, burst_ms=1000.0, now_s=0.0)
    budget.charge(1000.0, 3600.0)  # an hour of quiet saves up one burst, not more
    assert not budget.admits(3600.0)


def test_a_factor_of_zero_lifts_the_bound():
    budget = InputBudget(factor=0.0, burst_ms=0.0, now_s=0.0)
    budget.charge(10_000_000.0, 0.0)
    assert budget.admits(0.0)
