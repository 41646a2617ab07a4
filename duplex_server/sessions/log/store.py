"""The session log interface every backend implements (memory, sqlite, redis).

Appends are batches: all records of one command land together or not at all,
each batch carries the writer's fencing token, and client ``event_id``s are
deduplicated within a window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from duplex_server.sessions.core.records import Record

EVENT_ID_WINDOW = 1024


class LogError(Exception):
    """Base of everything a backend refuses."""


class StaleFence(LogError):
    """The writer's fencing token is older than the lease's: it was deposed."""


class DuplicateEvent(LogError):
    """A client ``event_id`` inside the idempotency window was appended before."""

    def __init__(self, event_id: str, seq: int | None = None) -> None:
        super().__init__(f"event_id {event_id!r} already appended (seq {seq})")
        self.event_id = event_id
        self.seq = seq  # where it landed, where the backend knows


class UnknownSession(LogError):
    pass


class StorageUnavailable(LogError):
    """The store cannot take the write now (disk full, read-only, Redis
    unreachable); nothing was recorded and the caller may retry later."""


class LeaseHeld(LogError):
    """Another live replica holds the session's lease (shared stores only)."""

    def __init__(self, session_id: str, holder: str, ttl_ms: int) -> None:
        super().__init__(f"{session_id} is held by {holder} for {ttl_ms} ms more")
        self.holder = holder
        self.ttl_ms = ttl_ms


# What a renewal finds: still ours, taken by a newer fence, or another
# replica asked for it (a client resumed there).
LeaseStatus = Literal["held", "lost", "handoff"]


class SequenceConflict(LogError):
    """The batch does not start right after the log's last seq: another writer
    appended, or the writer's view of the log is stale."""


@dataclass
class SessionRow:
    """What a backend knows of a session without reading its records."""

    session_id: str
    fence: int
    owner: str
    last_seq: int
    trimmed_upto: int
    closed: bool
    last_ts_ms: int
    media_expired: bool = False  # its media deleted by --media-retention-s


@runtime_checkable
class MediaRetaining(Protocol):
    """A store that keeps media apart from its records (Redis with
    ``--media-dir``): a session's media can be deleted while every record
    and its metadata stay."""

    async def expire_media(self, session_id: str) -> None:
        """Delete the session's media (audio, units, event payloads); its
        records read on, with empty audio and trimmed payloads."""
        ...


class SessionLog(Protocol):
    durable: bool  # outlives the process: sessions are suspended, not closed, on shutdown
    # Several processes serve this store: a lease expires unless renewed, a
    # detached session's lease is released, and any replica may take over.
    shared: bool

    async def create(self, session_id: str) -> None: ...

    async def acquire_lease(
        self,
        session_id: str,
        owner: str,
        *,
        expect_fence: int | None = None,
        handoff: bool = False,
    ) -> int:
        """Take the session's lease; returns the new (strictly larger) fencing token.

        ``expect_fence``: only if nobody took the session since that fence
        (``StaleFence`` otherwise). On a shared store a live lease of another
        owner raises ``LeaseHeld``; ``handoff`` asks that owner to let go.
        """
        ...

    async def renew_leases(self, owner: str, leases: dict[str, int]) -> dict[str, LeaseStatus]:
        """Extend the leases ``owner`` holds (session -> fence), all at once."""
        ...

    async def release_lease(self, session_id: str, owner: str, fence: int) -> None:
        """Let another replica take the session at once (detach, handoff)."""
        ...

    async def ping(self) -> bool:
        """Whether the store answers now (``/health``)."""
        ...

    async def append(self, session_id: str, records: list[Record], fence: int) -> list[int]:
        """Append atomically; the records carry consecutive seqs that must
        continue the log. Returns the seqs."""
        ...

    async def read(self, session_id: str, after_seq: int = 0) -> list[Record]: ...

    async def latest_snapshot(self, session_id: str) -> int:
        """The seq of the session's latest ``snapshot`` record (0: none),
        found without reading records: a refold starts there."""
        ...

    async def trim(self, session_id: str, upto_server_event_seq: int) -> int:
        """Drop payloads of outbound events up to the cursor; returns how many."""
        ...

    async def compact_audio(self, session_id: str, upto_seq: int) -> int:
        """Drop audio samples up to ``upto_seq``, keeping their metadata."""
        ...

    async def delete(self, session_id: str) -> None: ...

    async def sessions(self, *, open_only: bool = False) -> list[SessionRow]: ...

    async def read_open_sessions(self) -> dict[str, list[Record]]:
        """All records of every session not closed, by session (for recovery)."""
        ...

    async def close(self) -> None: ...


class LocalLeases:
    """Lease behaviour of a store only one process serves: a lease never
    lapses, there is nobody to hand a session to."""

    shared = False

    async def renew_leases(self, owner: str, leases: dict[str, int]) -> dict[str, LeaseStatus]:
        return dict.fromkeys(leases, "held")

    async def release_lease(self, session_id: str, owner: str, fence: int) -> None:
        return None

    async def ping(self) -> bool:
        return True
