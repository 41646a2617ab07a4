"""Admission, the registry of live actors, resume routing and the reaper.

On a shared store (Redis) the manager also keeps this replica's leases
alive, takes over sessions whose client resumes here while another replica
owns them (or owned them and died), and expires sessions nobody serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from duplex_server import metrics
from duplex_server.sessions.core.commands import check_session_patch
from duplex_server.sessions.core.config import merge_config
from duplex_server.sessions.core.gates import refuse_unsupported
from duplex_server.sessions.core.model_names import ModelNames, opening_model
from duplex_server.sessions.core.model_port import ModelPort, ProbedModel
from duplex_server.sessions.core.records import CallBody, Record, is_job_session
from duplex_server.sessions.core.server_inputs import token_refusal
from duplex_server.sessions.core.state import initial_state
from duplex_server.sessions.log.media import MediaSweeping
from duplex_server.sessions.log.store import (
    LeaseHeld,
    LogError,
    MediaRetaining,
    SessionLog,
    SessionRow,
    UnknownSession,
)
from duplex_server.sessions.log.tokens import new_session_id
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.actor import SessionActor
from duplex_server.sessions.runtime.actor_settings import ActorSettings
from duplex_server.sessions.runtime.attachment import Attachment
from duplex_server.sessions.runtime.lease import SessionMoved
from duplex_server.sessions.runtime.mailbox import OwnerCheck, anyone, not_yours
from duplex_server.sessions.runtime.recovery import fold_tail, read_tail
from duplex_server.tracing import Tracing
from protocol.client_events import SessionResume
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate

log = logging.getLogger(__name__)

PURGE_BATCH = 32  # closed sessions deleted concurrently by the purge
PURGE_DUTY = 0.5  # the share of time the purge may keep the store busy


def _older(rows: list[SessionRow], horizon_ms: float) -> list[str]:
    return [row.session_id for row in rows if row.last_ts_ms < horizon_ms]


async def _paced(session_ids: list[str], operation: Callable[[str], Awaitable[None]]) -> None:
    """``operation`` on each session, PURGE_BATCH at a time, concurrently, so
    that they share the store's group commits (SQLite) or round trips
    (Redis): one by one, a fsync each, the purge fell behind a churn of 100
    sessions a second and the store grew without bound. Small batches,
    paced to at most PURGE_DUTY of the time: a live append queued behind a
    batch waits for that batch alone (256 at once, unpaced, stalled appends
    for a quarter of a second and the soak's p99 spiked every purge)."""
    for start in range(0, len(session_ids), PURGE_BATCH):
        began = time.monotonic()
        batch = session_ids[start : start + PURGE_BATCH]
        await asyncio.gather(*(operation(session_id) for session_id in batch))
        if start + PURGE_BATCH < len(session_ids):
            await purge_pause((time.monotonic() - began) * (1 / PURGE_DUTY - 1))


async def purge_pause(seconds: float) -> None:
    """The purge's rest between batches (a seam for the tests)."""
    await asyncio.sleep(seconds)


@dataclass
class _Takeover:
    """Serialises concurrent resumes of one session that another replica owns."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


@dataclass
class ManagerSettings:
    # What every session's actor is given; its owner is this replica.
    actor: ActorSettings
    max_sessions: int = 1000
    idle_ttl_s: float = 300.0
    disconnect_grace_s: float = 30.0
    reap_interval_s: float = 1.0
    retention_s: float = 7 * 24 * 3600.0
    # A closed session's media (audio, payloads) deleted this long after its
    # last record, its records kept (stores with media apart; 0: kept as long)
    media_retention_s: float = 0.0
    purge_interval_s: float = 60.0
    # How many ended sessions this replica remembers (how each ended, for a
    # late resume or GET /v1/sessions/{id}); the oldest are forgotten first.
    ended_sessions_kept: int = 10_000
    # Shared stores: how long a lease lives unrenewed (renewed every third of it).
    lease_ttl_s: float = 5.0
    # Session traces to an OTLP collector (duplex_server/tracing.py); None: off,
    # and actors get no tracer at all.
    tracing: Tracing | None = None

    @property
    def owner(self) -> str:
        """This replica, as the leases and the log's lease records name it."""
        return self.actor.owner


class SessionManager:
    def __init__(self, log: SessionLog, model: ModelPort, settings: ManagerSettings) -> None:
        self.log = log
        self.model = model
        self.settings = settings
        self.actors: dict[str, SessionActor] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._takeovers: dict[str, _Takeover] = {}
        self._recovery_pending = False
        self._deletions: set[asyncio.Task[None]] = set()  # closed logs leaving memory
        # A call's own id (a carrier's call sid) -> its session, for the
        # sideband socket; one entry a live call, dropped when it closes.
        self._call_ids: dict[str, str] = {}

    async def open(
        self,
        attachment: Attachment,
        patch: SessionUpdate,
        handshake: bool,
        openai_semantics: bool = False,
        owner: str | None = None,
        owner_quota: int = 0,
        address: str = "",
        address_quota: int = 0,
        call: CallBody | None = None,
    ) -> SessionActor:
        """``owner``: the principal opening it, which may hold ``owner_quota``
        live sessions at once; ``address``: the client's, which may hold
        ``address_quota`` (0: only the server's cap applies). A detached
        session waiting for its resume counts: closing sockets frees no slot."""
        refused = self.admission_refusal(owner, owner_quota, address, address_quota)
        if refused is not None:
            raise refused[1]
        session_id = new_session_id()
        actor = self._actor(session_id)
        actor.address = address
        self.actors[session_id] = actor
        try:
            await actor.open(attachment, patch, handshake, openai_semantics, owner, call)
        except LogError as exc:
            self.actors.pop(session_id, None)
            metrics.ADMISSIONS_REFUSED.labels("storage_unavailable").inc()
            metrics.STORE_ERRORS.labels("open").inc()
            raise ProtocolError(
                "storage_unavailable", f"cannot open a session: the session log failed ({exc})"
            ) from exc
        except BaseException:
            self.actors.pop(session_id, None)
            raise
        if call is not None:
            self._call_ids[call.call_id] = session_id  # the sideband names it so
        metrics.SESSIONS_OPENED.labels(self.model.name).inc()
        return actor

    def admission_refusal(
        self, owner: str | None, owner_quota: int, address: str, address_quota: int
    ) -> tuple[int, ProtocolError] | None:
        """Why a new session of ``owner``'s from ``address`` would be refused
        now (counted), with its HTTP status (503: the server is full; 429:
        the caller's quota), or None. Asked before a socket's upgrade too, so
        a client the server cannot take gets an HTTP answer, not a socket."""
        if self.at_capacity:
            metrics.ADMISSIONS_REFUSED.labels("capacity").inc()
            return 503, ProtocolError(
                "resource_exhausted",
                f"server is at capacity ({self.settings.max_sessions} sessions); retry later",
            )
        held = sum(1 for actor in self.actors.values() if actor.state.owner == owner)
        if owner_quota and held >= owner_quota:
            metrics.ADMISSIONS_REFUSED.labels("key_quota").inc()
            return 429, ProtocolError(
                "resource_exhausted",
                f"this key holds its quota of {owner_quota} live sessions; close one first",
            )
        from_address = sum(1 for actor in self.actors.values() if actor.address == address)
        if address_quota and from_address >= address_quota:
            metrics.ADMISSIONS_REFUSED.labels("address_quota").inc()
            return 429, ProtocolError(
                "resource_exhausted",
                f"{address_quota} live sessions were opened from this address; close one first",
            )
        return None

    def live_by_model(self) -> dict[str, int]:
        """Live sessions by model, for ``duplex_sessions_live``: one model a server."""
        return {self.model.name: len(self.actors)}

    @property
    def at_capacity(self) -> bool:
        """Whether admission is full: a new session would be refused."""
        return len(self.actors) >= self.settings.max_sessions

    async def unready(self) -> list[str]:
        """Why this replica should be sent no new sessions now (empty: it is
        ready): its store does not answer, its model cannot take a session,
        or admission is full. Resumes of its own sessions may still land."""
        reasons = []
        if not await self.log.ping():
            reasons.append("store_unreachable")
        if not self.model.loaded:
            reasons.append("model_not_loaded")
        if isinstance(self.model, ProbedModel):
            reasons += await self.model.unready_reasons()
        if self.at_capacity:
            reasons.append("admission_full")
        return reasons

    def check_opening_patch(self, patch: SessionUpdate) -> None:
        """Raise what opening a session with ``patch`` would (a client
        secret's config is checked when it is minted, not when it is used;
        its model as the OpenAI endpoint checks one: a name the model answers to)."""
        names = self.settings.actor.model_names or ModelNames.of(self.model.name)
        patch = opening_model(patch, names)
        check_session_patch(patch, self.model, None)
        blank = initial_state("sess_check", self.model.name, self.model.turn_detection_types)
        merge_config(blank.config, patch, self.model.turn_detection_types)

    async def resume(
        self, attachment: Attachment, request: SessionResume, may_use: OwnerCheck = anyone
    ) -> SessionActor:
        """Attach ``attachment`` to the session ``request`` names: its live
        actor here, or one rebuilt from a shared log. A model without resume
        refuses every resume first, whatever it names (``unsupported_session_resume``)."""
        if (refusal := refuse_unsupported(request, self.model.capabilities)) is not None:
            raise refusal
        actor = self.actors.get(request.session_id)
        if actor is not None:
            try:
                await actor.resume(attachment, request, may_use)
                return actor
            except SessionMoved:
                await actor.closed.wait()  # it stopped without writing; take it back below
        if self.log.durable and request.session_id not in self._ended:
            # Owned by another replica, or by no actor here (one that failed):
            # the log has the session, so it is rebuilt from there.
            actor = await self._take_over(request, may_use)
            await actor.resume(attachment, request, may_use)
            return actor
        if request.session_id in self._ended:
            raise ProtocolError(
                "session_resume_expired",
                f"session {request.session_id} ended ({self._ended[request.session_id]})",
                param="session_id",
                event_id=request.event_id,
            )
        raise ProtocolError(
            "invalid_session_resume",
            "no such session",
            param="session_id",
            event_id=request.event_id,
        )

    async def recover(self, now_ms: int | None = None, concurrency: int = 64) -> int:
        """Bring back every open session of the store; returns how many now wait
        for their client (the others expired while the server was down).

        Sessions recover concurrently so that their lease and recovery writes
        share group commits instead of paying one fsync each.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        gate = asyncio.Semaphore(concurrency)
        if self.log.shared:
            mine = [
                row.session_id
                for row in await self.log.sessions(open_only=True)
                if row.owner == self.settings.owner and not is_job_session(row.session_id)
            ]

            async def shared(session_id: str) -> bool:
                async with gate:
                    return await self._recover_shared(session_id, now_ms)

            return sum(await asyncio.gather(*(shared(sid) for sid in mine)))
        # Job sessions (the batch API) are the job runner's to finish, never
        # realtime sessions waiting for a client.
        open_ids = [
            row.session_id
            for row in await self.log.sessions(open_only=True)
            if not is_job_session(row.session_id)
        ]

        async def one(session_id: str) -> bool:
            async with gate:
                fence = await self.log.acquire_lease(session_id, self.settings.owner)
                records = await self._read_tail(session_id)
                return await self._restore(session_id, fence, records, now_ms)

        return sum(await asyncio.gather(*(one(sid) for sid in open_ids)))

    def _actor(self, session_id: str) -> SessionActor:
        tracing = self.settings.tracing
        tracer = None if tracing is None else tracing.session(session_id, self.model.name)
        actor = SessionActor(
            session_id, self.log, self.model, self.settings.actor, self._closed, tracer
        )
        actor.writer.snapshot_every = self.settings.actor.snapshot_every
        return actor

    async def _read_tail(self, session_id: str) -> list[Record]:
        """What a restore refolds: from the latest snapshot on (recovery.py)."""
        units = getattr(self.model, "resume_units", 0)
        return await read_tail(self.log, session_id, units if isinstance(units, int) else 0)

    async def recover_or_defer(self) -> None:
        """Recover at startup; if the store does not answer, serve degraded and
        let housekeeping retry (a Redis outage must not keep a replica down)."""
        try:
            recovered = await self.recover()
        except LogError as exc:
            log.error("recovery deferred, the store is unavailable: %s", exc)
            self._recovery_pending = True
            return
        self._recovery_pending = False
        if recovered:
            log.info("recovered %d session(s) awaiting resume", recovered)

    async def _recover_shared(self, session_id: str, now_ms: int) -> bool:
        """This replica's own sessions from before its restart (same replica
        id); the others wait for a resume or for orphan expiry."""
        try:
            fence = await self.log.acquire_lease(session_id, self.settings.owner)
        except LeaseHeld:
            return False  # another replica took it meanwhile
        records = await self._read_tail(session_id)
        return await self._restore(session_id, fence, records, now_ms)

    async def _restore(
        self,
        session_id: str,
        fence: int,
        records: list[Record],
        now_ms: int,
        *,
        keep_lease: bool = False,
    ) -> bool:
        """A live actor for a session whose lease this replica just took."""
        last_ts_ms = records[-1].ts_ms if records else now_ms
        actor = self._actor(session_id)
        downtime_s = max(0.0, (now_ms - last_ts_ms) / 1000.0)
        self.actors[session_id] = actor
        grace_s = self.settings.disconnect_grace_s
        if await actor.restore(records, fence, downtime_s, grace_s, keep_lease=keep_lease):
            if actor.state.call is not None:  # a WebRTC call, waiting for its new offer
                self._call_ids[actor.state.call.call_id] = session_id
            return True
        self._closed(session_id, actor.state.closed_reason or "disconnect_grace_expired")
        return False

    # --- shared stores: takeover, lease keeping, orphans --------------------

    async def _take_over(self, request: SessionResume, may_use: OwnerCheck) -> SessionActor:
        """Serve here a session another replica owns or owned: check the token
        against the log, ask the owner to let go (or wait out a dead owner's
        lease), then rebuild the session from its stream."""
        session_id = request.session_id
        takeover = self._takeovers.setdefault(session_id, _Takeover())
        takeover.users += 1
        try:
            async with takeover.lock:
                actor = self.actors.get(session_id)
                if actor is not None:
                    return actor  # a concurrent resume took it over already
                return await self._take_over_locked(request, may_use)
        finally:
            takeover.users -= 1
            if takeover.users == 0:  # kept only while resumes wait on it
                self._takeovers.pop(session_id, None)

    async def _take_over_locked(self, request: SessionResume, may_use: OwnerCheck) -> SessionActor:
        session_id = request.session_id
        self._check_resumable(request, await self._read_for_resume(request), may_use)
        fence = await self._acquire_waiting(request)
        records = await self._read_tail(session_id)
        now_ms = int(time.time() * 1000)
        if not await self._restore(session_id, fence, records, now_ms, keep_lease=True):
            raise ProtocolError(
                "session_resume_expired",
                f"session {session_id} ended (disconnect_grace_expired)",
                param="session_id",
                event_id=request.event_id,
            )
        metrics.TAKEOVERS.inc()
        return self.actors[session_id]

    async def _read_for_resume(self, request: SessionResume) -> list[Record]:
        try:
            return await self._read_tail(request.session_id)
        except UnknownSession:
            raise ProtocolError(
                "invalid_session_resume",
                "no such session",
                param="session_id",
                event_id=request.event_id,
            ) from None
        except LogError as exc:
            raise ProtocolError(
                "storage_unavailable", f"cannot read the session: {exc}", event_id=request.event_id
            ) from exc

    def _check_resumable(
        self, request: SessionResume, records: list[Record], may_use: OwnerCheck
    ) -> None:
        state = fold_tail(
            records,
            initial_state(request.session_id, self.model.name, self.model.turn_detection_types),
        )
        if state.closed_reason is not None:
            raise ProtocolError(
                "session_resume_expired",
                f"session {request.session_id} ended ({state.closed_reason})",
                param="session_id",
                event_id=request.event_id,
            )
        if not may_use(state.owner):
            raise not_yours(request)  # another key's session: nothing moves
        if (wrong_token := token_refusal(state, request)) is not None:
            raise wrong_token  # checked before disturbing the owner: it moves nothing

    async def _acquire_waiting(self, request: SessionResume) -> int:
        """The lease, once its owner handed it over or its TTL ran out."""
        patience = self.settings.lease_ttl_s + 1.0
        deadline = time.monotonic() + patience
        while True:
            try:
                return await self.log.acquire_lease(
                    request.session_id, self.settings.owner, handoff=True
                )
            except LeaseHeld as held:
                if time.monotonic() >= deadline:
                    raise ProtocolError(
                        "resource_exhausted",
                        f"session is still served by replica {held.holder}, which did not "
                        f"hand it over within {patience:.1f} s; retry the resume",
                        event_id=request.event_id,
                    ) from None
                await asyncio.sleep(min(held.ttl_ms / 1000, 0.05) + 0.001)
            except LogError as exc:
                raise ProtocolError(
                    "storage_unavailable",
                    f"cannot take the session's lease: {exc}",
                    event_id=request.event_id,
                ) from exc

    async def _keep_leases_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_ttl_s / 3)
            await self.renew_leases()

    async def renew_leases(self) -> None:
        """Extend every lease this replica holds; stop serving any it lost.

        A lease is renewed only once taken (a session still opening has fence
        0, which the store would call lost), and a verdict counts only for the
        fence it was asked about: while the renewal was in flight the actor
        may have let the lease go and taken it back with a newer fence (a
        resume here), and that lease is not lost."""
        held = {
            sid: a.lease.fence
            for sid, a in self.actors.items()
            if a.lifecycle.holds_lease and a.lease.fence
        }
        try:
            statuses = await self.log.renew_leases(self.settings.owner, held)
        except LogError as exc:
            log.warning("lease renewal failed: %s", exc)
            return
        for session_id, status in statuses.items():
            actor = self.actors.get(session_id)
            if status == "held" or actor is None:
                continue
            if actor.lifecycle.holds_lease and actor.lease.fence == held[session_id]:
                log.info("session %s: lease %s (fence %d)", session_id, status, held[session_id])
                actor.post(mb.LeaseLost(status))

    async def expire_orphans(self, now_ms: int) -> list[str]:
        """Close sessions whose owner died and whose client never came back:
        no lease, not served here, silent for longer than the grace."""
        horizon = now_ms - self.settings.disconnect_grace_s * 1000
        expired = []
        for row in await self.log.sessions(open_only=True):
            if row.session_id in self.actors or row.last_ts_ms >= horizon:
                continue
            if is_job_session(row.session_id):
                continue  # the job runner finishes it
            try:
                fence = await self.log.acquire_lease(row.session_id, self.settings.owner)
            except LeaseHeld:
                continue  # a live replica serves it
            records = await self.log.read(row.session_id)
            if not await self._restore(row.session_id, fence, records, now_ms):
                expired.append(row.session_id)
        return expired

    def actor_for_call(self, call_id: str) -> SessionActor | None:
        """The live session a sideband socket names: by the call's own id, or
        by the session's id (every call is a session)."""
        return self.actors.get(self._call_ids.get(call_id, call_id))

    def _closed(self, session_id: str, reason: str) -> None:
        actor = self.actors.pop(session_id, None)
        if actor is not None and actor.state.call is not None:
            self._call_ids.pop(actor.state.call.call_id, None)
        if reason == "moved":
            return  # served by another replica now: not ended
        if reason == "failed" and self.log.durable:
            return  # a bug stopped its actor, not the session: a resume rebuilds it
        self._ended[session_id] = reason
        while len(self._ended) > self.settings.ended_sessions_kept:
            self._ended.popitem(last=False)
        if not self.log.durable:
            # Nothing on the memory store outlives this process, and a closed
            # session's log (its audio above all) is of use to nobody: it
            # leaves memory now, not after the retention. How it ended stays.
            task = asyncio.get_running_loop().create_task(self.log.delete(session_id))
            self._deletions.add(task)
            task.add_done_callback(self._deletions.discard)

    def ended_reason(self, session_id: str) -> str | None:
        return self._ended.get(session_id)

    # --- reaper ------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._reaper = loop.create_task(self._reap_forever())
        if self.log.shared:
            self._keeper = loop.create_task(self._keep_leases_forever())

    async def _reap_forever(self) -> None:
        next_purge = 0.0
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            now = time.monotonic()
            self.reap(now)
            if now >= next_purge:
                next_purge = now + self.settings.purge_interval_s
                await self._housekeeping(int(time.time() * 1000))

    async def _housekeeping(self, now_ms: int) -> None:
        if self._recovery_pending:
            await self.recover_or_defer()
        try:
            await self.purge(now_ms)
            if self.log.shared:
                await self.expire_orphans(now_ms)
            if isinstance(self.log, MediaSweeping):
                # segments a crash or an outage left unlisted would outlive
                # every retention: some of them each time, after the purge
                await self.log.sweep_media(now_ms / 1000)
        except LogError as exc:
            log.warning("housekeeping skipped: %s", exc)

    async def purge(self, now_ms: int) -> list[str]:
        """Delete closed sessions whose last record is older than the
        retention; before that, where the store keeps media apart, delete
        the media of those older than the media retention."""
        rows = [
            row
            for row in await self.log.sessions()
            if row.closed
            and row.session_id not in self.actors
            and not is_job_session(row.session_id)  # the job runner's own retention
        ]
        doomed = _older(rows, now_ms - self.settings.retention_s * 1000)
        await _paced(doomed, self.log.delete)
        if self.settings.media_retention_s and isinstance(self.log, MediaRetaining):
            horizon = now_ms - self.settings.media_retention_s * 1000
            kept = {row.session_id for row in rows if not row.media_expired} - set(doomed)
            await _paced(
                [sid for sid in _older(rows, horizon) if sid in kept], self.log.expire_media
            )
        return doomed

    def reap(self, now: float) -> None:
        for actor in list(self.actors.values()):
            if (detached_at := actor.lifecycle.detached_at) is not None:
                if now - detached_at >= self.settings.disconnect_grace_s:
                    actor.end("disconnect_grace_expired")
                continue
            ttl = actor.state.config.idle_timeout_s or self.settings.idle_ttl_s
            if now - actor.last_activity >= ttl:
                actor.end("idle_ttl_expired")

    async def shutdown(self) -> None:
        for task in (self._reaper, self._keeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        actors = list(self.actors.values())
        for actor in actors:
            # A durable log outlives this process: the next one resumes them.
            if self.log.durable:
                actor.post(mb.Suspend())
            else:
                actor.end("shutdown")
        for actor in actors:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(actor.closed.wait(), timeout=3.0)
        await asyncio.gather(*self._deletions)
        if self.settings.tracing is not None:
            # What the exporter still queues goes out now (it blocks on the collector).
            await asyncio.to_thread(self.settings.tracing.shutdown)
