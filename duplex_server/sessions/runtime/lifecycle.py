"""Where a live session stands, as one value with a table of allowed moves
(in the spirit of h11's state machine): whether a socket is attached, whether
this process holds the session's lease, and whether its actor still serves it.

Two things an actor tracks stay outside on purpose: the store's health (a
refused append makes the state suspect until a refold heals it) and whether
an end is already queued; neither is a phase the session moves through.
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    OPENING = "opening"  # being created or rebuilt; the lease is being taken
    ATTACHED = "attached"  # a socket is attached; the lease is held
    DETACHED = "detached"  # no socket, within the disconnect grace; the lease is held
    RELEASED = "released"  # no socket; the lease was let go to the shared store
    SUSPENDED = "suspended"  # handed over at shutdown: this process serves it no more
    MOVED = "moved"  # another replica owns it: stop, write nothing
    CLOSED = "closed"  # its close is in the log


_ENDS = {Phase.SUSPENDED, Phase.MOVED, Phase.CLOSED}
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.OPENING: frozenset({Phase.ATTACHED, Phase.DETACHED, Phase.RELEASED, Phase.CLOSED}),
    # ATTACHED -> ATTACHED: a resume replaced the socket; -> RELEASED: a handoff
    Phase.ATTACHED: frozenset({Phase.ATTACHED, Phase.DETACHED, Phase.RELEASED} | _ENDS),
    Phase.DETACHED: frozenset({Phase.ATTACHED, Phase.RELEASED} | _ENDS),
    # RELEASED -> DETACHED: a resume took the lease back, the socket comes next
    Phase.RELEASED: frozenset({Phase.ATTACHED, Phase.DETACHED} | _ENDS),
    Phase.SUSPENDED: frozenset(),
    Phase.MOVED: frozenset(),
    Phase.CLOSED: frozenset(),
}
_HOLDS_LEASE = frozenset({Phase.OPENING, Phase.ATTACHED, Phase.DETACHED})


class LifecycleError(RuntimeError):
    """A move the table does not allow: a bug in the actor, never the client's."""


class Lifecycle:
    def __init__(self) -> None:
        self.phase = Phase.OPENING
        # monotonic time the socket went away (the reaper's grace counts from it)
        self.detached_at: float | None = None

    def to(self, phase: Phase, *, at: float | None = None) -> None:
        """Move to ``phase``; ``at`` is when a socket went away (detaching)."""
        if phase not in TRANSITIONS[self.phase]:
            raise LifecycleError(f"a session cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase
        if phase is Phase.ATTACHED:
            self.detached_at = None
        elif at is not None:
            self.detached_at = at

    @property
    def holds_lease(self) -> bool:
        return self.phase in _HOLDS_LEASE

    @property
    def serving(self) -> bool:
        """Whether the actor still serves the session (its loop goes on)."""
        return self.phase not in _ENDS

    def exit_reason(self, closed_reason: str | None, failed: bool) -> str:
        """Why the actor stopped, for the manager: ``moved`` and ``failed``
        leave the session open (served elsewhere, or rebuilt on resume)."""
        if self.phase is Phase.MOVED:
            return "moved"
        if failed:
            return "failed"
        return closed_reason or "shutdown"
