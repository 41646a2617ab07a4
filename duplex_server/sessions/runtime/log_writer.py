"""The one place a session's batches meet its store: append first, apply second.

The writer owns the session's state (the fold of what landed) and its
journal's intake. ``commit`` appends a batch under the lease's fence and
then hands its outbound events to the journal; when the store refuses, it
says why as data (:data:`Refusal`) and the actor decides what the session
does about it (answer a duplicate, leave a deposed lease, stop an answer the
store cannot record). It holds no reference to the actor, so a closed
session is freed by reference counting at once (tests/test_session_memory).

A refused append leaves the state built with it wrong: the writer is then
``dirty`` until ``heal`` refolds it from the log once the store answers.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from duplex_server import metrics
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.pipeline import duplicate_event
from duplex_server.sessions.core.records import OutBody, Record, SnapshotBody
from duplex_server.sessions.core.state import SessionState, apply, encode_snapshot
from duplex_server.sessions.log.store import DuplicateEvent, LogError, SessionLog, StaleFence
from duplex_server.sessions.runtime.answer_timing import AnswerTiming
from duplex_server.sessions.runtime.journal import Journal
from duplex_server.sessions.runtime.lease import SessionLease
from duplex_server.sessions.runtime.recovery import (
    fold_tail,
    journal_entries,
    media_bytes,
    read_tail,
    tail_from,
)
from duplex_server.sessions.runtime.retention import AudioRetention
from duplex_server.tracing import SessionTracer
from protocol.capabilities import Capabilities
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Duplicate:
    """The store knew the batch's event id (older than the state's window of
    recent ids): nothing landed; the client is told it was a retry."""

    error: ProtocolError


@dataclass(frozen=True)
class Deposed:
    """Another process holds a newer fence: this one must stop writing."""


@dataclass(frozen=True)
class StoreDown:
    """The store failed (or its answer was lost): the state is dirty."""

    error: ProtocolError


Refusal = Duplicate | Deposed | StoreDown


# A snapshot record follows this many records (actor_settings.snapshot_every).
DEFAULT_SNAPSHOT_EVERY = 2000


def _now_ms() -> int:
    return int(time.time() * 1000)


class LogWriter:
    def __init__(
        self,
        store: SessionLog,
        session_id: str,
        initial: Callable[[], SessionState],
        capabilities: Capabilities,
        lease: SessionLease,
        journal: Journal,
        retention: AudioRetention,
        timing: AnswerTiming,
        tracer: SessionTracer | None = None,
    ) -> None:
        self._store = store
        self._session_id = session_id
        self._initial = initial
        self._capabilities = capabilities
        self._lease = lease
        self._journal = journal
        self._retention = retention
        self._timing = timing
        # The session's trace (duplex_server/tracing.py); None when tracing is
        # off, so the hook below costs one test per append.
        self.tracer = tracer
        self.state: SessionState = initial()
        # The store refused an append: the state may not match the log, and
        # nothing is served until a refold from the log succeeds.
        self.dirty = False
        # Arrival of the client frame whose batch is being committed, for
        # the answer timing (None for what no frame brought).
        self.input_at: float | None = None
        # Snapshots (0: none). Set by the manager from its settings.
        self.snapshot_every = DEFAULT_SNAPSHOT_EVERY
        self._since_snapshot = 0
        self._media_bytes = 0  # held by the log so far (the snapshot's count)
        # (server_event_seq, seq) of journaled out records: where the
        # journal's oldest entry lies in the log, for a snapshot's tail_from.
        self._out_seqs: deque[tuple[int, int]] = deque()

    def new_batch(self, event_id: str | None = None) -> Batch:
        return Batch(self.state, self._capabilities, _now_ms(), event_id)

    async def commit(self, batch: Batch) -> Refusal | None:
        """Append the batch and journal its events; None once it landed."""
        batch.settle()  # the floor's change, for batches built outside the step
        if not batch.records:
            return None
        started = time.perf_counter()
        try:
            await self._store.append(self._session_id, batch.records, self._lease.fence)
        except DuplicateEvent as dup:
            await self.refold()
            return Duplicate(duplicate_event(dup.event_id, dup.seq))
        except StaleFence:
            log.warning("session %s: deposed (stale fence %s)", self._session_id, self._lease.fence)
            return Deposed()
        except (LogError, OSError) as exc:
            log.error("session %s: append failed: %s", self._session_id, exc)
            metrics.STORE_ERRORS.labels("append").inc()
            self.dirty = True
            message = f"the session log is unavailable: {exc}"
            return StoreDown(ProtocolError("storage_unavailable", message, event_id=batch.answers))
        landed = time.perf_counter()
        metrics.STORE_APPEND_LATENCY.observe(landed - started)
        self._timing.landed(self.state, batch.records, self.input_at, landed)
        if self.tracer is not None:
            self.tracer.landed(self.state, batch.records, landed - started)
        self._retention.note(batch)
        if self._retention.due():
            await self._tidy(self._retention.landed())
        evicted = self._journal.add(batch.outbound)
        if evicted is not None:
            await self._tidy(self._store.trim(self._session_id, evicted))
        self._noted(batch.records)
        if self.snapshot_every and self._since_snapshot >= self.snapshot_every:
            await self._snapshot()
        return None

    def _noted(self, records: list[Record]) -> None:
        self._since_snapshot += len(records)
        self._media_bytes += media_bytes(records)
        for record in records:
            if isinstance(record.body, OutBody) and not record.body.trimmed:
                self._out_seqs.append((record.body.server_event_seq, record.seq))
        while self._out_seqs and self._out_seqs[0][0] <= self._journal.dropped_upto:
            self._out_seqs.popleft()

    async def _snapshot(self) -> None:
        """Append the state as it stands, through the fenced path every batch
        takes (a deposed writer's snapshot is refused as its batches are).
        A refusal is not the session's failure: the next batch meets it."""
        state = self.state
        journal_seq = self._out_seqs[0][1] if self._out_seqs else None
        body = SnapshotBody(
            state=encode_snapshot(state),
            media_bytes=self._media_bytes,
            tail_from=tail_from(state, journal_seq),
        )
        record = Record(state.epoch, _now_ms(), "server", body, seq=state.last_seq + 1)
        try:
            await self._store.append(self._session_id, [record], self._lease.fence)
        except (LogError, OSError) as exc:
            log.warning("session %s: snapshot not written: %s", self._session_id, exc)
            self._since_snapshot = 0  # try again an interval later
            return
        apply(state, record)
        self._since_snapshot = 0

    async def trim(self, upto: int) -> None:
        """The client acknowledged every event up to ``upto``: the journal and
        the log's outbound records let go of them, acknowledged audio may be
        compacted."""
        self._journal.trim(upto)
        await self._tidy(self._store.trim(self._session_id, upto))
        await self._tidy(self._retention.acknowledged(upto))

    async def _tidy(self, housekeeping: Awaitable[object]) -> None:
        """Trimming and compaction only free space, and each later call covers
        what an earlier one missed (both work up to a mark), so a store that
        refuses one now is logged, not fatal: the batch it follows landed."""
        try:
            await housekeeping
        except (LogError, OSError) as exc:
            log.warning("session %s: log housekeeping deferred: %s", self._session_id, exc)

    async def refold(self) -> None:
        """The state as the log has it (a handler's refusal left records half built)."""
        self.state = fold_tail(await read_tail(self._store, self._session_id), self._initial())

    def restore(self, records: list[Record]) -> None:
        """The state and the journal of a session another process wrote;
        ``records`` are the whole log or a tail read (``read_tail``)."""
        self.state = fold_tail(records, self._initial())
        self._journal.restore(journal_entries(records), self.state.server_event_seq)
        self._media_bytes = media_bytes(records)
        self._since_snapshot = 0
        self._out_seqs = deque(
            (r.body.server_event_seq, r.seq)
            for r in records
            if isinstance(r.body, OutBody) and not r.body.trimmed
        )

    async def heal(self) -> bool:
        """Refold from the log once the store answers again; False while it
        does not. A batch whose reply was lost may have landed: the journal
        is rebuilt from the log, so its events go out now."""
        try:
            records = await read_tail(self._store, self._session_id)
        except (LogError, OSError) as exc:
            log.warning("session %s: log still unavailable: %s", self._session_id, exc)
            return False
        self.restore(records)
        self.dirty = False
        return True
