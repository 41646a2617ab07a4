"""The session lifecycle as one value with a table of allowed moves."""

from __future__ import annotations

import pytest

from duplex_server.sessions.runtime.lifecycle import TRANSITIONS, Lifecycle, LifecycleError, Phase


def test_a_session_lives_attached_detached_released_and_back():
    life = Lifecycle()
    assert life.phase is Phase.OPENING and life.holds_lease and life.serving
    life.to(Phase.ATTACHED)
    life.to(Phase.DETACHED, at=12.5)
    assert (life.detached_at, life.holds_lease) == (12.5, True)
    life.to(Phase.RELEASED)
    assert not life.holds_lease and life.serving and life.detached_at == 12.5
    life.to(Phase.DETACHED)  # a resume took the lease back
    life.to(Phase.ATTACHED)
    assert life.detached_at is None and life.holds_lease


@pytest.mark.parametrize("end", [Phase.SUSPENDED, Phase.MOVED, Phase.CLOSED])
def test_the_ends_are_final(end):
    life = Lifecycle()
    life.to(Phase.ATTACHED)
    life.to(end)
    assert not life.serving and not life.holds_lease
    for phase in Phase:
        with pytest.raises(LifecycleError):
            life.to(phase)


def test_moves_the_table_does_not_allow_are_bugs():
    life = Lifecycle()
    with pytest.raises(LifecycleError):
        life.to(Phase.SUSPENDED)  # nothing to hand over before the session exists
    life.to(Phase.ATTACHED)
    life.to(Phase.RELEASED)  # a handoff while attached
    with pytest.raises(LifecycleError):
        life.to(Phase.OPENING)
    assert all(Phase.OPENING not in targets for targets in TRANSITIONS.values())
