"""Admission, the registry of live actors, resume routing and the reaper."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from duplex_server.sessions.actor import ActorSettings, SessionActor
from duplex_server.sessions.attachment import Attachment
from duplex_server.sessions.journal import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS
from duplex_server.sessions.log import LogError, SessionLog
from duplex_server.sessions.model_port import ModelPort
from duplex_server.sessions.records import Record
from duplex_server.sessions.tokens import new_session_id
from protocol.client_events import SessionResume
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate

TOMBSTONES = 10_000


@dataclass
class ManagerSettings:
    owner: str
    max_sessions: int = 1000
    idle_ttl_s: float = 300.0
    disconnect_grace_s: float = 30.0
    reap_interval_s: float = 1.0
    mailbox_size: int = 256
    journal_max_events: int = DEFAULT_MAX_EVENTS
    journal_max_bytes: int = DEFAULT_MAX_BYTES
    retain_audio: str = "all"
    retention_s: float = 7 * 24 * 3600.0
    purge_interval_s: float = 60.0
    observe_append: Callable[[float], None] | None = None
    on_open: Callable[[], None] | None = field(default=None)


class SessionManager:
    def __init__(self, log: SessionLog, model: ModelPort, settings: ManagerSettings) -> None:
        self.log = log
        self.model = model
        self.settings = settings
        self.actors: dict[str, SessionActor] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None

    def _actor_settings(self) -> ActorSettings:
        s = self.settings
        settings = ActorSettings(
            owner=s.owner,
            mailbox_size=s.mailbox_size,
            journal_max_events=s.journal_max_events,
            journal_max_bytes=s.journal_max_bytes,
            retain_audio=s.retain_audio,
        )
        if s.observe_append is not None:
            settings.observe_append = s.observe_append
        return settings

    async def open(
        self, attachment: Attachment, patch: SessionUpdate, handshake: bool
    ) -> SessionActor:
        if len(self.actors) >= self.settings.max_sessions:
            raise ProtocolError(
                "resource_exhausted",
                f"server is at capacity ({self.settings.max_sessions} sessions); retry later",
            )
        session_id = new_session_id()
        actor = SessionActor(session_id, self.log, self.model, self._actor_settings(), self._closed)
        self.actors[session_id] = actor
        try:
            await actor.open(attachment, patch, handshake)
        except LogError as exc:
            self.actors.pop(session_id, None)
            raise ProtocolError(
                "storage_unavailable", f"cannot open a session: the session log failed ({exc})"
            ) from exc
        except BaseException:
            self.actors.pop(session_id, None)
            raise
        if self.settings.on_open is not None:
            self.settings.on_open()
        return actor

    async def resume(self, attachment: Attachment, request: SessionResume) -> SessionActor:
        actor = self.actors.get(request.session_id)
        if actor is None:
            if request.session_id in self._ended:
                raise ProtocolError(
                    "session_resume_expired",
                    f"session {request.session_id} ended ({self._ended[request.session_id]})",
                    param="session_id",
                    event_id=request.event_id,
                )
            raise ProtocolError(
                "session_resume_invalid",
                "no such session",
                param="session_id",
                event_id=request.event_id,
            )
        await actor.resume(attachment, request)
        return actor

    async def recover(self, now_ms: int | None = None, concurrency: int = 64) -> int:
        """Bring back every open session of the store; returns how many now wait
        for their client (the others expired while the server was down).

        Sessions recover concurrently so that their lease and recovery writes
        share group commits instead of paying one fsync each.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        logs = await self.log.read_open_sessions()
        gate = asyncio.Semaphore(concurrency)

        async def one(session_id: str, records: list[Record]) -> bool:
            async with gate:
                return await self._recover_one(session_id, records, now_ms)

        results = await asyncio.gather(*(one(sid, recs) for sid, recs in logs.items()))
        return sum(results)

    async def _recover_one(self, session_id: str, records: list[Record], now_ms: int) -> bool:
        last_ts_ms = records[-1].ts_ms if records else now_ms
        actor = SessionActor(session_id, self.log, self.model, self._actor_settings(), self._closed)
        downtime_s = max(0.0, (now_ms - last_ts_ms) / 1000.0)
        self.actors[session_id] = actor
        if await actor.restore(records, downtime_s, self.settings.disconnect_grace_s):
            return True
        self._closed(session_id, "disconnect_grace_expired")
        return False

    def _closed(self, session_id: str, reason: str) -> None:
        self.actors.pop(session_id, None)
        self._ended[session_id] = reason
        while len(self._ended) > TOMBSTONES:
            self._ended.popitem(last=False)

    def ended_reason(self, session_id: str) -> str | None:
        return self._ended.get(session_id)

    # --- reaper ------------------------------------------------------------

    def start(self) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        next_purge = 0.0
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            now = time.monotonic()
            self.reap(now)
            if now >= next_purge:
                next_purge = now + self.settings.purge_interval_s
                await self.purge(int(time.time() * 1000))

    async def purge(self, now_ms: int) -> list[str]:
        """Delete closed sessions whose last record is older than the retention."""
        horizon = now_ms - self.settings.retention_s * 1000
        doomed = [
            row.session_id
            for row in await self.log.sessions()
            if row.closed and row.last_ts_ms < horizon and row.session_id not in self.actors
        ]
        for session_id in doomed:
            await self.log.delete(session_id)
        return doomed

    def reap(self, now: float) -> None:
        for actor in list(self.actors.values()):
            if actor.detached_at is not None:
                if now - actor.detached_at >= self.settings.disconnect_grace_s:
                    actor.end("disconnect_grace_expired")
                continue
            ttl = actor.state.config.idle_timeout_s or self.settings.idle_ttl_s
            if now - actor.last_activity >= ttl:
                actor.end("idle_ttl_expired")

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        actors = list(self.actors.values())
        for actor in actors:
            # A durable log outlives this process: the next one resumes them.
            if self.log.durable:
                actor.suspend()
            else:
                actor.end("shutdown")
        for actor in actors:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(actor.closed.wait(), timeout=3.0)
