"""This process's lease on one session: its fencing token, and taking,
letting go and taking back the lease in step with the session's lifecycle.

On a shared store (Redis) the lease is let go when the socket detaches, so
another replica may take the session at once; taking it back on resume
fails when one did (the session is served there now)."""

from __future__ import annotations

import logging

from duplex_server.sessions.core.server_inputs import LeaseHolder
from duplex_server.sessions.log.store import LeaseHeld, LogError, SessionLog, StaleFence
from duplex_server.sessions.runtime.lifecycle import Lifecycle, Phase
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)


class SessionMoved(Exception):
    """Another replica took the session over while this one held it detached;
    the caller resumes it there (the lease is the truth, not this actor)."""


class SessionLease:
    def __init__(
        self, store: SessionLog, session_id: str, owner: str, lifecycle: Lifecycle
    ) -> None:
        self._store = store
        self._session_id = session_id
        self._owner = owner
        self._lifecycle = lifecycle
        self.fence = 0  # every append carries it; the store refuses an older one

    def holder(self) -> LeaseHolder:
        """Who writes the session now, as its lease records name it."""
        return LeaseHolder(self._owner, self.fence)

    async def acquire(self) -> None:
        """Take the lease of a new session."""
        self.fence = await self._store.acquire_lease(self._session_id, self._owner)

    async def release(self) -> None:
        """Let the lease go (shared stores only); a failure leaves it to lapse."""
        if not (self._store.shared and self._lifecycle.holds_lease):
            return
        self._lifecycle.to(Phase.RELEASED)
        try:
            await self._store.release_lease(self._session_id, self._owner, self.fence)
        except (LogError, OSError) as exc:
            # The lease then lapses by its TTL instead: slower, equally safe.
            log.warning("session %s: could not release the lease: %s", self._session_id, exc)

    async def take_back(self) -> None:
        """Hold the lease again for a resume. Raises :class:`SessionMoved` when
        another replica took the session meanwhile, ``storage_unavailable``
        when the store does not answer."""
        if self._lifecycle.holds_lease:
            return
        try:
            self.fence = await self._store.acquire_lease(
                self._session_id, self._owner, expect_fence=self.fence
            )
        except (StaleFence, LeaseHeld):
            self._lifecycle.to(Phase.MOVED)
            raise SessionMoved(self._session_id) from None
        except (LogError, OSError) as exc:
            raise ProtocolError(
                "storage_unavailable", f"could not take the session's lease: {exc}"
            ) from exc
        self._lifecycle.to(Phase.DETACHED)  # the lease is ours again; the socket comes next
