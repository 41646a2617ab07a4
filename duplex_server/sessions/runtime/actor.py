"""The session actor: one task, one mailbox, append first and apply second.

Everything that changes a session passes through ``_mailbox`` in order:
client commands, engine chunks, attach/resume/detach, timers. For each, the
actor builds a :class:`Batch` (records applied to its state as they are
built), appends it to the log under its fencing token, and only then hands
the outbound events to the journal that the socket's sender drains.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import assert_never

from duplex_server import metrics
from duplex_server.sessions.core import effects as fx
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import (
    HandlerContext,
    append_format,
    check_session_patch,
    decode_append,
)
from duplex_server.sessions.core.config import (
    merge_config,
    response_config,
    response_output_format,
    with_default_turn_detection,
)
from duplex_server.sessions.core.heard import HeardCommand, TurnEnded
from duplex_server.sessions.core.model_names import ModelNames, opening_model
from duplex_server.sessions.core.model_port import (
    ModelPort,
    ResponseRequest,
    StreamSetup,
    history_view,
    session_view,
    stream_setup,
)
from duplex_server.sessions.core.pipeline import Command, admit, apply, duplicate_event
from duplex_server.sessions.core.records import (
    AudioBody,
    CloseBody,
    CloseReason,
    ConfigBody,
    LeaseAction,
    LeaseBody,
    Record,
)
from duplex_server.sessions.core.responses import (
    cancel_response,
    finish_response,
    project_unit_outputs,
)
from duplex_server.sessions.core.snapshot import session_object
from duplex_server.sessions.core.state import Response, SessionState, fold, initial_state
from duplex_server.sessions.log.store import (
    DuplicateEvent,
    LeaseStatus,
    LogError,
    SessionLog,
    StaleFence,
)
from duplex_server.sessions.log.tokens import hash_token, new_resume_token, token_matches
from duplex_server.sessions.runtime import log_context
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.answer_timing import AnswerTiming
from duplex_server.sessions.runtime.attachment import Attachment
from duplex_server.sessions.runtime.codecs import SessionCodecs
from duplex_server.sessions.runtime.hearing import Hearing
from duplex_server.sessions.runtime.idle_timer import IdleTimer
from duplex_server.sessions.runtime.input_budget import InputBudget
from duplex_server.sessions.runtime.journal import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS, Journal
from duplex_server.sessions.runtime.lease import SessionLease, SessionMoved
from duplex_server.sessions.runtime.lifecycle import Lifecycle, Phase
from duplex_server.sessions.runtime.mailbox import OwnerCheck, anyone, not_yours
from duplex_server.sessions.runtime.model_feed import open_feed
from duplex_server.sessions.runtime.recovery import (
    journal_entries,
    media_bytes,
    recent_turn_audio,
    stepped_units,
)
from duplex_server.sessions.runtime.retention import AudioRetention
from duplex_server.sessions.runtime.turn_feed import RECENT_TURNS
from protocol.client_events import ClientEvent, InputAudioAppend, InputAudioCommit, SessionResume
from protocol.close_codes import CloseCode
from protocol.codec import encode_server_event
from protocol.errors import ProtocolError, error_body
from protocol.server_events import (
    Error,
    SessionClosed,
    SessionCreated,
    SessionExpired,
    SessionHeartbeatAck,
    SessionReplaced,
    SessionResumed,
    SessionResyncRequired,
    SessionUpdated,
)
from protocol.session_config import SessionUpdate

log = logging.getLogger(__name__)

# Appends larger than this (base64 characters: ~190 KB of samples, 4 s of
# 24 kHz pcm16) are decoded on a worker thread instead of the event loop.
OFFLOAD_DECODE_CHARS = 256 * 1024

DRAIN_TIMEOUT_S = 2.0


@dataclass
class ActorSettings:
    owner: str
    mailbox_size: int = 256
    journal_max_events: int = DEFAULT_MAX_EVENTS
    journal_max_bytes: int = DEFAULT_MAX_BYTES
    # "all": keep input audio in the log; "uncommitted": once the client has
    # acknowledged a turn's commit, its samples are compacted to metadata.
    retain_audio: str = "all"
    # Input media admitted per second of wall time, and the burst beyond it
    # (token bucket, runtime/input_budget.py); a factor of 0 lifts the bound.
    max_input_realtime_factor: float = 2.0
    input_burst_ms: float = 10_000.0
    # Media (audio samples, video frames) one session may put in the log.
    max_session_media_bytes: int = 1024 * 1024 * 1024
    # After a response's first text delta, text gathers this long before the
    # next one: a delta, record and frame per interval, not per token (0: each
    # token as it comes). Audio and function calls never wait.
    text_delta_interval_ms: float = 20.0
    # The names the model answers to (None: its adapter's name, and OpenAI's
    # realtime names as aliases).
    model_names: ModelNames | None = None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _epoch_reader(actor: weakref.ref[SessionActor]) -> Callable[[], int]:
    """The session's current epoch, read through a weak reference: the feed
    outlives no actor, but holding the actor strongly would make a cycle."""

    def epoch() -> int:
        live = actor()
        if live is None:
            raise RuntimeError("the session's actor is gone; its feed should be too")
        return live.state.epoch

    return epoch


def _setup_reader(actor: weakref.ref[SessionActor]) -> Callable[[], StreamSetup | None]:
    """What a primed native model hears first: the session's setup, once it
    has input (None before), read through a weak reference as the epoch is."""

    def setup() -> StreamSetup | None:
        live = actor()
        if live is None:
            raise RuntimeError("the session's actor is gone; its feed should be too")
        return stream_setup(live.state.config) if live.state.input_started else None

    return setup


class SessionActor:
    def __init__(
        self,
        session_id: str,
        log_backend: SessionLog,
        model: ModelPort,
        settings: ActorSettings,
        on_closed: Callable[[str, str], None],
    ) -> None:
        self.session_id = session_id
        self._log = log_backend
        self.model = model
        self.settings = settings
        self.names = settings.model_names or ModelNames.of(model.name)
        self.idle = IdleTimer()
        self._on_closed = on_closed
        self.state: SessionState = self._initial()
        self.journal = Journal(settings.journal_max_events, max_bytes=settings.journal_max_bytes)
        # (server_event_seq of input_audio_buffer.committed, record seq of its commit)
        self.retention = AudioRetention(log_backend, session_id, settings.retain_audio)
        self.attachment: Attachment | None = None
        self._mailbox: asyncio.Queue[mb.Message] = asyncio.Queue()
        self._pending_client = 0
        self._heartbeats = 0  # acks sent, for their event ids
        self.timing = AnswerTiming()
        self._input_at: float | None = None  # arrival of the client frame being applied
        # The model, unit by unit or turn by turn, behind one interface.
        # What the actor hands its parts refers to its mailbox, never back to
        # the actor: a closed session (its journal, its buffered audio) is then
        # freed by reference counting at once. A cycle would wait for the
        # cyclic GC, whose thresholds ``serve`` raises far out of the way.
        post = self._mailbox.put_nowait
        me = weakref.ref(self)
        self._feed = open_feed(
            model,
            session_id,
            post,
            _epoch_reader(me),
            _setup_reader(me),
            text_delta_interval_s=settings.text_delta_interval_ms / 1000,
        )
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only weak refs
        self.last_activity = time.monotonic()
        self.closed = asyncio.Event()
        # Attached or not, holding the lease or not, serving or not. On a shared
        # store the lease is let go on detach, so another replica may take over.
        self.lifecycle = Lifecycle()
        self.lease = SessionLease(log_backend, session_id, settings.owner, self.lifecycle)
        # The store refused an append: the state may not match the log, and
        # nothing is served until a refold from the log succeeds.
        self._dirty = False
        self.codecs = SessionCodecs()
        # The client address that opened it, for per-address caps ("" for a
        # session restored from the log: it counts against no address).
        self.address = ""
        self.input_budget = InputBudget(
            settings.max_input_realtime_factor,
            settings.input_burst_ms,
            settings.max_session_media_bytes,
            time.monotonic(),
        )
        self.hearing = Hearing(model, post)
        self._end_requested = False

    @property
    def fence(self) -> int:
        return self.lease.fence

    @property
    def holds_lease(self) -> bool:
        return self.lifecycle.holds_lease

    @property
    def detached_at(self) -> float | None:
        """Monotonic time the socket went away, None while one is attached."""
        return self.lifecycle.detached_at

    def _initial(self) -> SessionState:
        return initial_state(self.session_id, self.model.name, self.model.turn_detection_types)

    # --- lifecycle (called by the manager) ---------------------------------

    async def open(
        self,
        attachment: Attachment,
        patch: SessionUpdate,
        handshake: bool,
        openai_semantics: bool = False,
        owner: str | None = None,
    ) -> None:
        """Create the log, take the lease, announce ``session.created`` to the socket."""
        # A refused opening patch stores nothing: checked before the log exists.
        patch = opening_model(patch, self.names, strict=openai_semantics)
        check_session_patch(patch, self.model, None)
        merge_config(self.state.config, patch, self.model.turn_detection_types)
        await self._log.create(self.session_id)
        await self.lease.acquire()
        # A model that serves no resume gets no token: nothing to present later.
        token = new_resume_token() if self.model.capabilities.supports_session_resume else None
        batch = self.new_batch()
        self._lease_fact(batch, "attach", 1, token)
        opening = with_default_turn_detection(patch, self.model.turn_detection_types)
        batch.fact(ConfigBody(patch=opening, openai_semantics=openai_semantics, owner=owner))
        if handshake:
            batch.emit(SessionUpdated(session=self._snapshot()))
        if not await self.commit_batch(batch):
            raise LogError(f"could not record the opening of {self.session_id}")
        attachment.generation = 1
        self.attachment = attachment
        self.lifecycle.to(Phase.ATTACHED)
        created = SessionCreated(
            session=self._snapshot(),
            attachment_generation=1,
            resume_token=token,
            event_id=f"event_{self.session_id[-8:]}_c1",
        )
        await attachment.send_now(encode_server_event(created))
        attachment.start_sender(self.journal, 0, self._overflow_notice)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def restore(
        self,
        records: list[Record],
        fence: int,
        downtime_s: float,
        grace_s: float,
        *,
        keep_lease: bool = False,
    ) -> bool:
        """Rebuild a session a dead process owned; False if it expired meanwhile.

        The state is the fold of its log, read after the caller took the lease
        with ``fence`` (so the old owner, were it alive, could not write); a
        response that was in flight is closed as incomplete
        (``server_restart``), keeping in history only what playback acks
        covered. The session then waits, detached, for ``session.resume`` for
        what is left of its grace; ``keep_lease`` when that resume is already
        here (a takeover), else the lease is let go as on any detach.
        """
        self.state = fold(records, self._initial())
        self.lease.fence = fence
        self.journal.restore(journal_entries(records), self.state.server_event_seq)
        self.input_budget.used_bytes = media_bytes(records)
        for item_id, pcm in recent_turn_audio(self.state, records, RECENT_TURNS):
            self._feed.keep_turn(item_id, pcm)
        self._feed.restore(stepped_units(records))
        batch = self.new_batch()
        if self.state.response is not None:
            finish_response(batch, "incomplete", "server_restart")
        self._lease_fact(batch, "takeover", self.state.lease.generation)
        self._lease_fact(batch, "detach", self.state.lease.generation)
        expired = downtime_s >= grace_s
        if expired:
            batch.emit(SessionExpired(reason="disconnect_grace_expired"))
            batch.fact(CloseBody(reason="disconnect_grace_expired"), origin="manager")
        if not await self.commit_batch(batch):
            raise LogError(f"could not record the recovery of {self.session_id}")
        if expired:
            await self._release_lease()
            self.lifecycle.to(Phase.CLOSED)
            self.closed.set()
            return False
        self.lifecycle.to(Phase.DETACHED, at=time.monotonic() - downtime_s)
        if not keep_lease:
            await self._release_lease()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return True

    def post_client(self, event: ClientEvent, generation: int) -> bool:
        """Queue a client command; False when the mailbox is full (flood)."""
        return self._post_from_socket(mb.Client(event, generation, time.perf_counter()))

    def _post_from_socket(self, message: mb.SocketMessage) -> bool:
        """Queue what a socket sent, counted against the mailbox bound until
        applied; False when the mailbox is full (flood)."""
        if self._pending_client >= self.settings.mailbox_size:
            return False
        self._pending_client += 1
        self._mailbox.put_nowait(message)
        return True

    def heartbeat(self, generation: int) -> bool:
        """Answer a socket's liveness signal; False when the mailbox is full.

        A heartbeat concerns one socket, like ``session.created``: it keeps
        the session from idling out and is answered to that socket alone,
        never recorded (docs/decisions/wire.md, "heartbeats"). It is answered here
        at once unless a command of this socket is still queued or being
        applied, or a storage failure left the state to heal; then it waits
        its turn in the mailbox, so that its ack still says everything sent
        before it was applied, and a client that only heartbeats through an
        outage learns how it ended (the heal runs before the ack)."""
        if not self._pending_client and not self._dirty:
            self._answer_heartbeat(generation)
            return True
        return self._post_from_socket(mb.Heartbeat(generation))

    def _answer_heartbeat(self, generation: int) -> None:
        if self.attachment is None or generation != self.attachment.generation:
            return  # a superseded socket's late frame
        self.last_activity = time.monotonic()
        self._heartbeats += 1
        ack = SessionHeartbeatAck(
            event_id=f"event_{self.session_id[-8:]}_h{generation}_{self._heartbeats}",
            epoch=self.state.epoch,
            session_id=self.session_id,
        )
        # After every event journaled before it: those were sent before it.
        self.attachment.send_after(self.journal.last_seq, [encode_server_event(ack)])

    def read_pause_s(self) -> float:
        """How long the socket should go unread (input past its budget)."""
        return self.input_budget.read_pause_s(time.monotonic())

    def post_reject(self, error: ProtocolError, generation: int) -> bool:
        """Queue the error for a frame that did not decode (journaled in order)."""
        return self._post_from_socket(mb.Reject(error, generation))

    async def resume(
        self, attachment: Attachment, request: SessionResume, may_use: OwnerCheck = anyone
    ) -> None:
        """``may_use(owner)``: whether the caller may take a session its
        ``owner`` opened (checked against the log's owner, in the actor)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._mailbox.put_nowait(mb.Resume(attachment, request, done, may_use))
        await done

    def detach(self, generation: int) -> None:
        self._mailbox.put_nowait(mb.Detach(generation))

    def end(self, reason: CloseReason) -> None:
        """Close the session (expiry, shutdown); asking twice queues it once,
        so a reaper tick that finds it still open does not pile up requests."""
        if self._end_requested:
            return
        self._end_requested = True
        self._mailbox.put_nowait(mb.End(reason))

    def suspend(self) -> None:
        """Stop serving but keep the session resumable (durable store, restart)."""
        self._mailbox.put_nowait(mb.Suspend())

    def post(self, message: mb.Message) -> None:
        """Queue a message for the actor's loop (engine and stage results)."""
        self._mailbox.put_nowait(message)

    def lease_lost(self, status: LeaseStatus) -> None:
        """The lease renewal found the session taken, or asked for by another replica."""
        self._mailbox.put_nowait(mb.LeaseLost(status))

    # --- the loop ----------------------------------------------------------

    async def _run(self) -> None:
        # This task's log lines, and those of the tasks it starts, name the
        # session. Weakly: the task's context must not keep a closed actor
        # alive (a cycle through it would wait for the cyclic GC).
        actor = weakref.ref(self)
        log_context.bind(
            self.session_id, lambda: None if (live := actor()) is None else live.state.response
        )
        failed = False
        try:
            self._feed.start()
            # A closed state ends the loop only if the log holds the close: a
            # closing batch sets closed_reason before it is appended, and one
            # the store refused (dirty) must not end the actor, its socket open.
            while self.lifecycle.serving and (self._dirty or self.state.closed_reason is None):
                message = await self._mailbox.get()
                await self._dispatch(message)
        except Exception:
            # A bug in the actor ends this actor loudly: logged with its
            # traceback, and the socket closed with INTERNAL_ERROR so the client is not
            # left talking to nobody. The log keeps everything appended so far,
            # and the session is not over: a resume rebuilds it from the log.
            failed = True
            log.exception("session %s: actor failed", self.session_id)
            if self.attachment is not None:
                await self.attachment.close(CloseCode.INTERNAL_ERROR, "internal error")
        finally:
            self.hearing.close()
            try:
                await self._feed.close()
            finally:
                self.closed.set()
                self._on_closed(self.session_id, self._exit_reason(failed))

    def _exit_reason(self, failed: bool) -> str:
        """Why this actor stopped, for the manager: ``moved`` and ``failed``
        leave the session open (served elsewhere, or rebuilt on resume)."""
        if self.lifecycle.phase is Phase.MOVED:
            return "moved"
        if failed:
            return "failed"
        return self.state.closed_reason or "shutdown"

    async def _dispatch(self, message: mb.Message) -> None:
        # Every message heals a state a storage failure left wrong, not only
        # those that need the log: a detach, an end or a suspend also append,
        # and a batch built on the wrong state would not follow the log.
        if self._dirty and not await self._heal() and isinstance(message, mb.NEEDS_LOG):
            await self._refuse_unrecorded(message)
            return
        if not self.lifecycle.serving:
            return  # the heal found the session closed, and closed its socket
        match message:
            case mb.Client() | mb.Reject() | mb.Heartbeat():
                # Counted until applied, not until taken: a heartbeat is answered
                # at once only while none of its socket's commands is in flight.
                try:
                    await self._on_socket(message)
                finally:
                    self._pending_client -= 1
            case mb.Chunks():
                await self._on_chunks(message)
            case mb.StreamEnd():
                await self._on_stream_end(message)
            case mb.Resume():
                await self._on_resume(message)
            case mb.Detach():
                await self._on_detach(message)
            case mb.End():
                await self._on_end(message.reason)
            case mb.Suspend():
                await self._on_suspend()
            case mb.LeaseLost():
                await self._leave(message.status)
            case mb.Partial():
                await self._run_heard(self.hearing.partial(self.state, message))
            case mb.UnitOutputs():
                await self._on_unit_outputs(message)
            case mb.ModelFailed():
                await self._on_model_failed(message)
            case _:
                assert_never(message)

    def new_batch(self, event_id: str | None = None) -> Batch:
        return Batch(self.state, self.model.capabilities, _now_ms(), event_id)

    def _lease_fact(
        self, batch: Batch, action: LeaseAction, generation: int, token: str | None = None
    ) -> None:
        """Record an attachment change; only the token's hash enters the log."""
        batch.fact(
            LeaseBody(
                action=action,
                owner=self.settings.owner,
                fence=self.fence,
                generation=generation,
                token_hash=hash_token(token) if token is not None else None,
            ),
            origin="manager",
        )

    def _overflow_notice(self, oldest: int) -> bytes:
        return encode_server_event(
            SessionResyncRequired(
                reason="journal_overflow", session=self._snapshot(), oldest_available_seq=oldest
            )
        )

    def _snapshot(self):
        return session_object(self.state, self.model.capabilities)

    async def commit_batch(self, batch: Batch) -> bool:
        """Append the batch; on refusal restore the state from the log."""
        batch.settle()  # the floor's change, for batches built outside the step
        if not batch.records:
            return True
        started = time.perf_counter()
        try:
            await self._log.append(self.session_id, batch.records, self.fence)
        except DuplicateEvent as dup:
            # Older than the state's window of recent ids, not the store's.
            await self._refold()
            await self.reject(duplicate_event(dup.event_id, dup.seq))
            return False
        except StaleFence:
            log.warning("session %s: deposed (stale fence %s)", self.session_id, self.fence)
            await self._leave("lost")
            return False
        except (LogError, OSError) as exc:
            log.error("session %s: append failed: %s", self.session_id, exc)
            metrics.STORE_ERRORS.labels("append").inc()
            self._storage_failed()
            await self._send_error_now(
                ProtocolError(
                    "storage_unavailable",
                    f"the session log is unavailable: {exc}",
                    event_id=batch.answers,
                )
            )
            return False
        landed = time.perf_counter()
        metrics.STORE_APPEND_LATENCY.observe(landed - started)
        self.timing.landed(self.state, batch.records, self._input_at, landed)
        self.retention.note(batch)
        evicted = self.journal.add(batch.outbound)
        if evicted is not None:
            await self._tidy(self._log.trim(self.session_id, evicted))
        return True

    async def _tidy(self, housekeeping: Awaitable[object]) -> None:
        """Trimming and compaction only free space, and each later call covers
        what an earlier one missed (both work up to a mark), so a store that
        refuses one now is logged, not fatal: the batch it follows landed."""
        try:
            await housekeeping
        except (LogError, OSError) as exc:
            log.warning("session %s: log housekeeping deferred: %s", self.session_id, exc)

    async def _refold(self) -> None:
        self.state = fold(await self._log.read(self.session_id), self._initial())

    def _storage_failed(self) -> None:
        """The batch did not land (or its landing is unknown): the state built
        with it is wrong, and a response whose output cannot be recorded must
        not carry on with a hole in it, so its stream stops here."""
        self._dirty = True
        self._feed.stop_all()

    async def _heal(self) -> bool:
        """Refold from the log once the store answers again; ends as failed
        the response whose stream a storage failure stopped."""
        try:
            records = await self._log.read(self.session_id)
        except (LogError, OSError) as exc:
            log.warning("session %s: log still unavailable: %s", self.session_id, exc)
            return False
        self.state = fold(records, self._initial())
        # A batch whose reply was lost may have landed: its events go out now.
        self.journal.restore(journal_entries(records), self.state.server_event_seq)
        self._dirty = False
        if self.state.closed_reason is not None:
            # The closing batch landed though its append failed (a timeout
            # lost the reply): once the journal's close went out, so does the socket.
            await self._finish_close()
            return True
        if self.state.response is not None:
            batch = self.new_batch()
            batch.emit(
                Error(
                    error=error_body(
                        ProtocolError(
                            "storage_unavailable",
                            "the response was stopped: its output could not be recorded",
                        )
                    )
                )
            )
            finish_response(batch, "failed", "storage_unavailable")
            await self.commit_batch(batch)
        return not self._dirty

    async def _refuse_unrecorded(self, message: mb.NeedsLog) -> None:
        """Answer what cannot be recorded while the store is down; nothing is
        applied. What needs no answer (engine output, a partial transcript)
        is dropped: the heal that follows the outage stops its response."""
        reason = "the session log is unavailable; retry"
        match message:
            case mb.Client():
                self._pending_client -= 1
                await self._send_error_now(
                    ProtocolError("storage_unavailable", reason, event_id=message.event.event_id)
                )
            case mb.Reject():
                self._pending_client -= 1
            case mb.Resume():
                message.done.set_exception(ProtocolError("storage_unavailable", reason))
            case mb.Chunks() | mb.StreamEnd() | mb.Partial() | mb.UnitOutputs() | mb.ModelFailed():
                pass
            case _:
                assert_never(message)

    async def _leave(self, status: LeaseStatus) -> None:
        """The lease is another replica's now (``lost``) or is asked for
        (``handoff``): stop writing, tell the socket, let the lease go."""
        if not self.lifecycle.serving:
            return
        self._feed.stop_all()
        attachment = self.attachment
        self.attachment = None
        if attachment is not None:
            await attachment.stop()
            await attachment.send_now(
                encode_server_event(SessionReplaced(attachment_generation=attachment.generation))
            )
            await attachment.close(CloseCode.MOVED, "session.replaced")
        if status == "handoff":
            await self._release_lease()
        self.lifecycle.to(Phase.MOVED)

    async def _release_lease(self) -> None:
        await self.lease.release()

    async def _reacquire_lease(self, message: mb.Resume) -> bool:
        """A detached session's lease was let go; take it back unless another
        replica took the session meanwhile (then it is served there)."""
        try:
            await self.lease.take_back()
        except (SessionMoved, ProtocolError) as exc:
            message.done.set_exception(exc)
            return False
        return True

    async def _send_error_now(self, err: ProtocolError) -> None:
        if self.attachment is not None:
            await self.attachment.send_now(encode_server_event(Error(error=error_body(err))))

    # --- client commands ---------------------------------------------------

    async def _on_socket(self, message: mb.SocketMessage) -> None:
        match message:
            case mb.Client():
                await self._on_client(message)
            case mb.Heartbeat():
                self._answer_heartbeat(message.generation)
            case mb.Reject():
                attachment = self.attachment
                if attachment is not None and message.generation == attachment.generation:
                    await self.reject(message.error)
            case _:
                assert_never(message)

    async def _on_client(self, message: mb.Client) -> None:
        if self.attachment is None or message.generation != self.attachment.generation:
            return  # a superseded socket's late frame
        self._input_at = message.received_at
        try:
            await self._apply_client(message)
        finally:
            self._input_at = None

    async def _apply_client(self, message: mb.Client) -> None:
        event = message.event
        self.last_activity = time.monotonic()
        done = await self._execute(event)
        if done is None:
            return
        batch, effects = done
        metrics.APPEND_LATENCY.observe(time.perf_counter() - message.received_at)
        if isinstance(event, InputAudioCommit):
            self.timing.committed(message.received_at)
        await self.apply_effects(effects)
        if isinstance(event, InputAudioAppend):
            self._charge_input(batch)
            self._feed_model(batch)
            await self._hear(batch)

    async def _execute(self, command: Command) -> tuple[Batch, fx.Effects] | None:
        """Admit the command, prepare its context, apply it and append its
        batch; None when it was refused (the client is told why) or could
        not be recorded. Admitted before the context: a retried commit must
        not be transcribed again."""
        admitted = admit(self.state, command, self.model.capabilities)
        if isinstance(admitted, ProtocolError):
            await self.reject(admitted)
            return None
        ctx = await self._context_for(command)
        before = self.state.last_seq
        try:
            batch, effects = apply(self.state, admitted, ctx, _now_ms())
        except ProtocolError as err:
            if self.state.last_seq != before:
                await self._refold()
            await self.reject(err)
            return None
        if not await self.commit_batch(batch):
            return None
        return batch, effects

    async def _context_for(self, command: Command) -> HandlerContext:
        """What the runtime prepares before the pure step: the transcript of
        the buffer a commit seals, the session's Opus decoder for appends."""
        if isinstance(command, InputAudioCommit | TurnEnded):
            speech_end = command.at_ms if isinstance(command, TurnEnded) else None
            heard = await self.hearing.transcribe(self.state, speech_end)
            return HandlerContext(
                self.model,
                names=self.names,
                transcript=heard.text,
                transcript_told=heard.told,
                transcription_error=heard.error,
                transcription_ms=heard.wait_ms,
            )
        if isinstance(command, InputAudioAppend):
            refused = self.input_budget.refusal(time.monotonic())
            if refused is None and self._feed.full:
                refused = ProtocolError(
                    "rate_limited", "the model is behind real time on this session's audio"
                )
            decoded = None
            if refused is None and len(command.audio) > OFFLOAD_DECODE_CHARS:
                decoded = await self._decode_off_loop(command)
            return HandlerContext(
                self.model,
                names=self.names,
                decode_stream=self.codecs.decode_opus,
                input_refused=refused,
                decoded=decoded,
            )
        return HandlerContext(self.model, names=self.names)

    async def _decode_off_loop(self, event: InputAudioAppend) -> bytes | ProtocolError | None:
        """Decode (and for Opus, run the session's decoder over) a large
        append on a worker thread, so one client's big chunk never holds the
        event loop; the actor waits, other sessions run. None when the
        append is refused before decoding (the handler says why)."""
        try:
            fmt = append_format(self.state, event)
        except ProtocolError:
            return None
        try:
            return await asyncio.to_thread(decode_append, event, fmt, self.codecs.decode_opus)
        except ProtocolError as err:
            return err

    # --- hearing: server VAD, partial transcripts, speech over the answer ----

    async def _hear(self, batch: Batch) -> None:
        """Run what hearing decides about the chunk just appended, one
        command at a time (each sees the session as the last one left it)."""
        audio = next((r.body for r in batch.records if isinstance(r.body, AudioBody)), None)
        if audio is None:
            return
        for transition in await self.hearing.hear(self.state, audio):
            await self._run_heard(self.hearing.decide(self.state, transition))
        await self._run_heard(self.hearing.overlap_hints(self.state, audio))
        await self._run_heard(self.hearing.after_audio(self.state))
        await self._run_heard(self.idle.check(self.state))

    async def _run_heard(self, command: HeardCommand | None) -> None:
        if command is None:
            return
        decided_at = time.perf_counter()
        done = await self._execute(command)
        if done is not None:
            if isinstance(command, TurnEnded):
                self.timing.speech_stopped(decided_at)
            self.hearing.recorded(command)
            await self.apply_effects(done[1])

    async def reject(self, err: ProtocolError) -> None:
        """Journal an error event for a rejected input; the session keeps serving."""
        err.forget_traceback()
        batch = self.new_batch()
        # Its records do not carry the refused event's id (a retry must not be
        # taken for a duplicate), but a store failure must still name it.
        batch.answers = err.event_id
        batch.emit(Error(error=error_body(err)))
        await self.commit_batch(batch)

    async def apply_effects(self, effects: fx.Effects) -> None:
        """Do what a landed step asks outside the log, in the order it asks."""
        for effect in effects:
            match effect:
                case fx.KeepTurn(item_id, pcm):
                    self._feed.keep_turn(item_id, pcm)
                case fx.StopAnswer(response_id):
                    self._feed.stop(response_id)
                case fx.StartAnswer(response):
                    self._start_stream(response)
                case fx.Trim(upto):
                    self.journal.trim(upto)
                    await self._tidy(self._log.trim(self.session_id, upto))
                    await self._tidy(self.retention.acknowledged(upto))
                case fx.Close():
                    await self._finish_close()
                case _:
                    assert_never(effect)

    # --- the model: its input and its output ---------------------------------

    def _charge_input(self, batch: Batch) -> None:
        media_ms = sum(r.body.duration_ms for r in batch.records if isinstance(r.body, AudioBody))
        self.input_budget.charge(media_ms, media_bytes(batch.records), time.monotonic())

    def _feed_model(self, batch: Batch) -> None:
        for record in batch.records:
            if isinstance(record.body, AudioBody):
                self._feed.feed(record.body.pcm, record.body.sample_rate_hz)

    async def _on_unit_outputs(self, message: mb.UnitOutputs) -> None:
        """What the model decided for the units it stepped; output of an
        epoch fenced since (a cancel, a barge-in) is dropped unseen. The
        unit itself is logged whatever the epoch: the model's state moved
        on, and a restore must rebuild it as it is."""
        if self.state.closed_reason is not None:
            return
        batch = self.new_batch()
        if message.unit is not None:
            batch.fact(message.unit, origin="engine")
        if message.epoch == self.state.epoch:
            project_unit_outputs(batch, message.outputs, self._stream_encoder)
        if batch.records:
            await self.commit_batch(batch)

    async def _on_model_failed(self, message: mb.ModelFailed) -> None:
        """The model gave up on this session: the client hears why, and an
        answer it was giving ends failed."""
        if self.state.closed_reason is not None:
            return
        batch = self.new_batch()
        batch.emit(Error(error=error_body(ProtocolError("engine_error", message.error))))
        if self.state.response is not None:
            finish_response(batch, "failed", "engine_error")
        await self.commit_batch(batch)

    def _start_stream(self, response: Response) -> None:
        self._feed.answer(
            ResponseRequest(
                session_id=self.session_id,
                response_id=response.id,
                epoch=response.epoch,
                modalities=list(response.modalities),
                history=history_view(self.state.items),
                config=session_view(response_config(self.state.config, response.overrides)),
            )
        )

    def _is_current(self, response_id: str, epoch: int) -> bool:
        active = self.state.response
        return active is not None and active.id == response_id and epoch == self.state.epoch

    async def _on_chunks(self, message: mb.Chunks) -> None:
        """Output of a response the session opened (a turn model's answer)."""
        outputs = self._feed.take(message.response_id)
        if not outputs or not self._is_current(message.response_id, message.epoch):
            return  # fenced off: stale output never reaches the log
        batch = self.new_batch()
        project_unit_outputs(batch, outputs, self._stream_encoder)
        await self.commit_batch(batch)

    def _stream_encoder(self, response_id: str) -> Callable[[bytes, int], bytes] | None:
        response = self.state.find_response(response_id)
        overrides = response.overrides if response is not None else None
        fmt = response_output_format(overrides, self.state.config.output_format)
        return self.codecs.stream_encoder(response_id, fmt)

    async def _on_stream_end(self, message: mb.StreamEnd) -> None:
        self._feed.forget(message.response_id)
        if not self._is_current(message.response_id, message.epoch):
            return
        batch = self.new_batch()
        if message.error is not None:
            batch.emit(Error(error=error_body(ProtocolError("engine_error", message.error))))
            finish_response(batch, "failed", "engine_error", message.stage_ms)
        else:
            finish_response(batch, "completed", stage_ms=message.stage_ms)
        if await self.commit_batch(batch):
            await self._run_heard(self.hearing.answer_ended())

    # --- attachments -------------------------------------------------------

    async def _on_resume(self, message: mb.Resume) -> None:
        request = message.request
        state = self.state
        cursor = request.last_received_server_event_seq
        if not message.may_use(state.owner):
            message.done.set_exception(not_yours(request))
            return
        if not token_matches(request.resume_token, state.lease.token_hash):
            message.done.set_exception(
                ProtocolError(
                    "invalid_resume_token",
                    "resume_token does not match this session",
                    param="resume_token",
                    event_id=request.event_id,
                )
            )
            return
        if cursor > state.server_event_seq:
            message.done.set_exception(
                ProtocolError(
                    "invalid_session_resume",
                    f"last_received_server_event_seq {cursor} is beyond the journal "
                    f"(last sent {state.server_event_seq})",
                    param="last_received_server_event_seq",
                    event_id=request.event_id,
                )
            )
            return
        if not await self._reacquire_lease(message):
            return
        token = new_resume_token()
        generation = state.lease.generation + 1
        batch = self.new_batch()
        self._lease_fact(batch, "resume", generation, token)
        if not await self.commit_batch(batch):
            message.done.set_exception(
                ProtocolError("storage_unavailable", "could not record the resume")
            )
            return
        await self._replace_attachment(generation)
        attachment = message.attachment
        attachment.generation = generation
        self.attachment = attachment
        self.lifecycle.to(Phase.ATTACHED)
        self.last_activity = time.monotonic()
        gap = cursor < self.journal.dropped_upto
        resumed = SessionResumed(
            session=self._snapshot(),
            attachment_generation=generation,
            resume_token=token,
            replay_from_seq=cursor + 1,
            replay_to_seq=self.journal.last_seq,
            event_id=f"event_{self.session_id[-8:]}_r{generation}",
        )
        await attachment.send_now(encode_server_event(resumed))
        if gap:
            await attachment.send_now(
                encode_server_event(
                    SessionResyncRequired(
                        reason="journal_gap",
                        session=self._snapshot(),
                        oldest_available_seq=self.journal.dropped_upto + 1,
                    )
                )
            )
            cursor = self.journal.last_seq
        attachment.start_sender(self.journal, cursor, self._overflow_notice)
        message.done.set_result(None)

    async def _replace_attachment(self, new_generation: int) -> None:
        old = self.attachment
        if old is None:
            return
        self.attachment = None
        await old.stop()
        await old.send_now(
            encode_server_event(SessionReplaced(attachment_generation=new_generation))
        )
        await old.close(CloseCode.REPLACED, "session.replaced")

    async def _on_detach(self, message: mb.Detach) -> None:
        attachment = self.attachment
        if attachment is None or attachment.generation != message.generation:
            return
        self.attachment = None
        await attachment.stop()
        self.lifecycle.to(Phase.DETACHED, at=time.monotonic())
        batch = self.new_batch()
        self._lease_fact(batch, "detach", self.state.lease.generation)
        if await self.commit_batch(batch):
            await self._release_lease()

    async def _on_end(self, reason: CloseReason) -> None:
        """Expiry or server shutdown: tell the client why, then close."""
        if self._dirty:
            self._end_requested = False  # the store is still down: the reaper asks again
            return
        if self.state.closed_reason is not None:
            return
        batch = self.new_batch()
        aborted = (
            cancel_response(batch, "session_ended", "incomplete") if self.state.response else None
        )
        if reason in ("disconnect_grace_expired", "idle_ttl_expired"):
            batch.emit(SessionExpired(reason=reason))
        else:
            # the remaining close reasons are all SessionClosed's
            batch.emit(SessionClosed(reason=reason, session_id=self.session_id))  # type: ignore[arg-type]
        batch.fact(CloseBody(reason=reason), origin="manager")
        if not await self.commit_batch(batch):
            self._end_requested = False  # not recorded: the reaper asks again
            return
        if aborted:
            self._feed.stop(aborted)
        await self._finish_close()

    async def _on_suspend(self) -> None:
        """Hand the session over to the next process: detach, tell the client to resume."""
        self._feed.stop_all()
        attachment = self.attachment
        if attachment is not None:
            self.attachment = None
            await attachment.stop()
            batch = self.new_batch()
            self._lease_fact(batch, "detach", self.state.lease.generation)
            await self.commit_batch(batch)
            await attachment.close(
                CloseCode.SERVICE_RESTART, "server restarting: resume the session"
            )
        await self._release_lease()
        self.lifecycle.to(Phase.SUSPENDED)

    async def _finish_close(self) -> None:
        if self.lifecycle.serving:
            self.lifecycle.to(Phase.CLOSED)
        attachment = self.attachment
        if attachment is None:
            return
        await attachment.drained(self.journal.last_seq, DRAIN_TIMEOUT_S)
        self.attachment = None
        await attachment.close(CloseCode.NORMAL, self.state.closed_reason or "closed")
