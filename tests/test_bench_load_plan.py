"""Where ``bench sessions`` runs its server and generator processes, and how
their clients are dealt: pure, no processes started."""

from __future__ import annotations

import pytest

from duplex_bench.load_client import Measures, merged
from duplex_bench.load_processes import CorePlan, deal, default_generators, plan_cores


def test_the_server_gets_the_first_cores_and_the_generators_the_rest():
    plan = plan_cores(None, (0, 1, 2, 3))
    assert plan.server == (0,) and plan.generators == (1, 2, 3)
    assert default_generators(plan, (0, 1, 2, 3)) == 3
    two = plan_cores(2, (0, 1, 2, 3))
    assert two.server == (0, 1) and two.generators == (2, 3)
    assert [two.generator_core(i) for i in range(3)] == [(2,), (3,), (2,)]


def test_one_core_or_server_cores_0_pins_nothing_and_says_so():
    for plan in (plan_cores(None, (0,)), plan_cores(0, (0, 1)), plan_cores(None, None)):
        assert plan.server is None and plan.generators is None
        assert plan.report()["pinned"] is False and "not pinned" in plan.report()["note"]
        assert plan.generator_core(0) is None
    assert default_generators(plan_cores(None, (0,)), (0,)) == 1
    assert default_generators(plan_cores(0, (0, 1, 2, 3)), (0, 1, 2, 3)) == 3


def test_the_server_cannot_take_every_core():
    with pytest.raises(ValueError, match="no core for the generators"):
        plan_cores(2, (0, 1))


def test_sessions_are_dealt_round_robin_and_keep_their_index():
    plan = CorePlan((0,), (1, 2), "")
    shares = deal(["ws://a", "ws://b"], 5, 2, plan, 100, 2.0)
    assert [s.indices for s in shares] == [(0, 2, 4), (1, 3)]
    assert [s.cores for s in shares] == [(1,), (2,)]
    assert all(s.sessions == 5 for s in shares)
    assert len(deal(["ws://a"], 2, 8, plan, 100, 2.0)) == 2  # no more generators than sessions


def test_measures_from_several_processes_pool():
    one = Measures(appends=3, heartbeat_rtt=[0.1], commit_to_audio=[0.2], errors=1)
    two = Measures(appends=4, heartbeat_rtt=[0.3], connect_failures=2)
    total = merged([one, two])
    assert (total.appends, total.errors, total.connect_failures) == (7, 1, 2)
    assert total.heartbeat_rtt == [0.1, 0.3] and total.commit_to_audio == [0.2]
