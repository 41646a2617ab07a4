"""The session actor: one task, one mailbox, append first and apply second.

Everything that changes a session passes through ``_mailbox`` in order:
client commands, model output, attach/resume/detach, timers. For each, the
core decides the records (``core/pipeline.py`` for commands,
``core/model_output.py`` for model output, ``core/server_inputs.py`` for the
server's own inputs) on a :class:`Batch`; the log writer appends it under
the lease's fence and journals its events for the socket's sender; then the
actor performs the step's effects. The actor moves bytes and time between
those parts; it decides no record itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from duplex_server import metrics
from duplex_server.sessions.core import effects as fx
from duplex_server.sessions.core import server_inputs as inputs
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import check_session_patch
from duplex_server.sessions.core.config import merge_config
from duplex_server.sessions.core.heard import HeardCommand, TurnEnded
from duplex_server.sessions.core.model_names import ModelNames, opening_model
from duplex_server.sessions.core.model_output import (
    answer_request,
    output_format,
    record_answer_output,
    record_model_failure,
    record_stream_end,
    record_unit_outputs,
)
from duplex_server.sessions.core.model_port import ModelPort, StreamSetup, stream_setup
from duplex_server.sessions.core.pipeline import Command, admit, apply
from duplex_server.sessions.core.records import AudioBody, CloseReason, Record
from duplex_server.sessions.core.snapshot import session_object
from duplex_server.sessions.core.state import SessionState, initial_state
from duplex_server.sessions.log.store import LeaseStatus, LogError, SessionLog
from duplex_server.sessions.log.tokens import new_resume_token
from duplex_server.sessions.runtime import log_context
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.answer_timing import AnswerTiming
from duplex_server.sessions.runtime.attachment import Attachment
from duplex_server.sessions.runtime.codecs import SessionCodecs
from duplex_server.sessions.runtime.hearing import Hearing
from duplex_server.sessions.runtime.idle_timer import IdleTimer
from duplex_server.sessions.runtime.input_budget import InputBudget
from duplex_server.sessions.runtime.input_preparation import InputPreparation
from duplex_server.sessions.runtime.journal import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS, Journal
from duplex_server.sessions.runtime.lease import SessionLease, SessionMoved
from duplex_server.sessions.runtime.lifecycle import Lifecycle, Phase
from duplex_server.sessions.runtime.log_writer import Deposed, Duplicate, LogWriter, StoreDown
from duplex_server.sessions.runtime.mailbox import OwnerCheck, anyone, not_yours
from duplex_server.sessions.runtime.model_feed import open_feed
from duplex_server.sessions.runtime.recovery import media_bytes, recent_turn_audio, stepped_units
from duplex_server.sessions.runtime.retention import AudioRetention
from duplex_server.sessions.runtime.socket_slot import SocketSlot
from duplex_server.sessions.runtime.turn_feed import RECENT_TURNS
from protocol.capabilities import Capabilities
from protocol.client_events import ClientEvent, InputAudioAppend, InputAudioCommit, SessionResume
from protocol.close_codes import CloseCode
from protocol.errors import ProtocolError, error_body
from protocol.server_events import Error, SessionObject
from protocol.session_config import SessionUpdate

log = logging.getLogger(__name__)


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


def _setup_reader(writer: LogWriter) -> Callable[[], StreamSetup | None]:
    """What a primed native model hears first: the session's setup, once it
    has input (None before)."""

    def setup() -> StreamSetup | None:
        state = writer.state
        return stream_setup(state.config) if state.input_started else None

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
        self.journal = Journal(settings.journal_max_events, max_bytes=settings.journal_max_bytes)
        self.timing = AnswerTiming()
        # Attached or not, holding the lease or not, serving or not. On a shared
        # store the lease is let go on detach, so another replica may take over.
        self.lifecycle = Lifecycle()
        self.lease = SessionLease(log_backend, session_id, settings.owner, self.lifecycle)
        self.writer = LogWriter(
            log_backend,
            session_id,
            functools.partial(initial_state, session_id, model.name, model.turn_detection_types),
            model.capabilities,
            self.lease,
            self.journal,
            AudioRetention(log_backend, session_id, settings.retain_audio),
            self.timing,
        )
        self.socket = SocketSlot(
            session_id,
            self.journal,
            functools.partial(_snapshot, self.writer, model.capabilities),
        )
        self._mailbox: asyncio.Queue[mb.Message] = asyncio.Queue()
        self._pending_client = 0
        # The model, unit by unit or turn by turn, behind one interface. What
        # its parts are handed refers to the mailbox and the writer, never
        # back to the actor: a closed session (its journal, its buffered
        # audio) is then freed by reference counting at once. A cycle would
        # wait for the cyclic GC, whose thresholds ``serve`` raises far out
        # of the way.
        post = self._mailbox.put_nowait
        writer = self.writer
        self._feed = open_feed(
            model,
            session_id,
            post,
            lambda: writer.state.epoch,
            _setup_reader(writer),
            text_delta_interval_s=settings.text_delta_interval_ms / 1000,
        )
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only weak refs
        self.last_activity = time.monotonic()
        self.closed = asyncio.Event()
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
        self._prepare = InputPreparation(
            model, self.names, self.hearing, self.input_budget, self.codecs, self._feed
        )
        self._end_requested = False

    @property
    def state(self) -> SessionState:
        return self.writer.state

    # --- verbs (the manager's and the socket's) ------------------------------

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
        batch = self.writer.new_batch()
        inputs.record_opening(
            batch,
            self._holder(),
            patch,
            token,
            handshake=handshake,
            openai_semantics=openai_semantics,
            owner=owner,
            turn_detection_types=self.model.turn_detection_types,
        )
        if not await self._commit(batch):
            raise LogError(f"could not record the opening of {self.session_id}")
        self.socket.attach(attachment, 1)
        self.lifecycle.to(Phase.ATTACHED)
        await self.socket.greet_opened(token)
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
        self.writer.restore(records)
        self.lease.fence = fence
        self.input_budget.used_bytes = media_bytes(records)
        for item_id, pcm in recent_turn_audio(self.state, records, RECENT_TURNS):
            self._feed.keep_turn(item_id, pcm)
        self._feed.restore(stepped_units(records))
        batch = self.writer.new_batch()
        expired = downtime_s >= grace_s
        inputs.record_restore(batch, self._holder(), expired=expired)
        if not await self._commit(batch):
            raise LogError(f"could not record the recovery of {self.session_id}")
        if expired:
            await self.lease.release()
            self.lifecycle.to(Phase.CLOSED)
            self.closed.set()
            return False
        self.lifecycle.to(Phase.DETACHED, at=time.monotonic() - downtime_s)
        if not keep_lease:
            await self.lease.release()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return True

    def post_client(self, event: ClientEvent, generation: int) -> bool:
        """Queue a client command; False when the mailbox is full (flood)."""
        return self._post_from_socket(mb.Client(event, generation, time.perf_counter()))

    def post_reject(self, error: ProtocolError, generation: int) -> bool:
        """Queue the error for a frame that did not decode (journaled in order)."""
        return self._post_from_socket(mb.Reject(error, generation))

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
        if not self._pending_client and not self.writer.dirty:
            self._answer_heartbeat(generation)
            return True
        return self._post_from_socket(mb.Heartbeat(generation))

    def _post_from_socket(self, message: mb.SocketMessage) -> bool:
        """Queue what a socket sent, counted against the mailbox bound until
        applied; False when the mailbox is full (flood)."""
        if self._pending_client >= self.settings.mailbox_size:
            return False
        self._pending_client += 1
        self._mailbox.put_nowait(message)
        return True

    def _answer_heartbeat(self, generation: int) -> None:
        if self.socket.answer_heartbeat(generation, self.state.epoch):
            self.last_activity = time.monotonic()

    def read_pause_s(self) -> float:
        """How long the socket should go unread (input past its budget)."""
        return self.input_budget.read_pause_s(time.monotonic())

    async def resume(
        self, attachment: Attachment, request: SessionResume, may_use: OwnerCheck = anyone
    ) -> None:
        """``may_use(owner)``: whether the caller may take a session its
        ``owner`` opened (checked against the log's owner, in the actor)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._mailbox.put_nowait(mb.Resume(attachment, request, done, may_use))
        await done

    def end(self, reason: CloseReason) -> None:
        """Close the session (expiry, shutdown); asking twice queues it once,
        so a reaper tick that finds it still open does not pile up requests."""
        if self._end_requested:
            return
        self._end_requested = True
        self._mailbox.put_nowait(mb.End(reason))

    def post(self, message: mb.Message) -> None:
        """Queue a message for the actor's loop: model output, a detach, a
        suspend, a lost lease."""
        self._mailbox.put_nowait(message)

    # --- the loop ----------------------------------------------------------

    async def _run(self) -> None:
        # This task's log lines, and those of the tasks it starts, name the
        # session. Through the writer, weakly: the task's context must not
        # keep a closed session's state alive.
        writer = weakref.ref(self.writer)
        log_context.bind(
            self.session_id, lambda: None if (live := writer()) is None else live.state.response
        )
        failed = False
        try:
            self._feed.start()
            # A closed state ends the loop only if the log holds the close: a
            # closing batch sets closed_reason before it is appended, and one
            # the store refused (dirty) must not end the actor, its socket open.
            while self.lifecycle.serving and (
                self.writer.dirty or self.state.closed_reason is None
            ):
                await self._dispatch(await self._mailbox.get())
        except Exception:
            # A bug in the actor ends this actor loudly: logged with its
            # traceback, and the socket closed with INTERNAL_ERROR so the client
            # is not left talking to nobody. The log keeps everything appended
            # so far, and the session is not over: a resume rebuilds it.
            failed = True
            log.exception("session %s: actor failed", self.session_id)
            await self.socket.fail()
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
        if self.writer.dirty and not await self._heal() and isinstance(message, mb.NEEDS_LOG):
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
            case mb.Chunks() | mb.StreamEnd() | mb.UnitOutputs() | mb.ModelFailed():
                await self._on_model(message)
            case mb.Partial():
                await self._run_heard(self.hearing.partial(self.state, message))
            case mb.Resume():
                await self._on_resume(message)
            case mb.Detach():
                await self._on_detach(message.generation)
            case mb.End():
                await self._on_end(message.reason)
            case mb.Suspend():
                await self._on_suspend()
            case mb.LeaseLost():
                await self._leave(message.status)
            case _:
                assert_never(message)

    # --- the log -----------------------------------------------------------

    def _holder(self) -> inputs.LeaseHolder:
        return inputs.LeaseHolder(self.settings.owner, self.lease.fence)

    async def _commit(self, batch: Batch) -> bool:
        """Append the batch; False when the store refused it, after doing
        what the refusal asks of the session."""
        refusal = await self.writer.commit(batch)
        match refusal:
            case None:
                return True
            case Duplicate(error):
                await self._reject(error)
            case Deposed():
                await self._leave("lost")
            case StoreDown(error):
                # A response whose output cannot be recorded must not carry
                # on with a hole in it: its stream stops here.
                self._feed.stop_all()
                await self.socket.send_error_now(error)
            case _:
                assert_never(refusal)
        return False

    async def _heal(self) -> bool:
        """Refold from the log once the store answers again; ends as failed
        the response whose stream a storage failure stopped."""
        if not await self.writer.heal():
            return False
        if self.state.closed_reason is not None:
            # The closing batch landed though its append failed (a timeout
            # lost the reply): once the journal's close went out, so does the socket.
            await self._finish_close()
            return True
        batch = self.writer.new_batch()
        inputs.record_outage_stop(batch)
        await self._commit(batch)
        return not self.writer.dirty

    async def _refuse_unrecorded(self, message: mb.NeedsLog) -> None:
        """Answer what cannot be recorded while the store is down; nothing is
        applied. What needs no answer (engine output, a partial transcript)
        is dropped: the heal that follows the outage stops its response."""
        reason = "the session log is unavailable; retry"
        match message:
            case mb.Client():
                self._pending_client -= 1
                await self.socket.send_error_now(
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

    async def _reject(self, err: ProtocolError) -> None:
        """Journal an error event for a rejected input; the session keeps serving."""
        err.forget_traceback()
        batch = self.writer.new_batch()
        # Its records do not carry the refused event's id (a retry must not be
        # taken for a duplicate), but a store failure must still name it.
        batch.answers = err.event_id
        batch.emit(Error(error=error_body(err)))
        await self._commit(batch)

    # --- commands: the client's, and what hearing decided --------------------

    async def _on_socket(self, message: mb.SocketMessage) -> None:
        match message:
            case mb.Client(event, generation, received_at) if self.socket.holds(generation):
                self.last_activity = time.monotonic()
                self.writer.input_at = received_at
                try:
                    await self._on_client(event, received_at)
                finally:
                    self.writer.input_at = None
            case mb.Client():
                pass  # a superseded socket's late frame
            case mb.Heartbeat():
                self._answer_heartbeat(message.generation)
            case mb.Reject() if self.socket.holds(message.generation):
                await self._reject(message.error)
            case mb.Reject():
                pass
            case _:
                assert_never(message)

    async def _on_client(self, event: ClientEvent, received_at: float) -> None:
        done = await self._execute(event)
        if done is None:
            return
        batch, effects = done
        metrics.APPEND_LATENCY.observe(time.perf_counter() - received_at)
        if isinstance(event, InputAudioCommit):
            self.timing.committed(received_at)
        await self._perform(effects)
        if isinstance(event, InputAudioAppend):
            self._prepare.charge(batch)
            for record in batch.records:
                if isinstance(record.body, AudioBody):
                    self._feed.feed(record.body.pcm, record.body.sample_rate_hz)
            await self._hear(batch)

    async def _execute(self, command: Command) -> tuple[Batch, fx.Effects] | None:
        """Admit the command, prepare its context, apply it and append its
        batch; None when it was refused (the client is told why) or could
        not be recorded. Admitted before the context: a retried commit must
        not be transcribed again."""
        admitted = admit(self.state, command, self.model.capabilities)
        if isinstance(admitted, ProtocolError):
            await self._reject(admitted)
            return None
        ctx = await self._prepare.context_for(self.state, command)
        before = self.state.last_seq
        try:
            batch, effects = apply(self.state, admitted, ctx, _now_ms())
        except ProtocolError as err:
            if self.state.last_seq != before:
                await self.writer.refold()
            await self._reject(err)
            return None
        if not await self._commit(batch):
            return None
        return batch, effects

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
            await self._perform(done[1])

    async def _perform(self, effects: fx.Effects) -> None:
        """Do what a landed step asks outside the log, in the order it asks."""
        for effect in effects:
            match effect:
                case fx.KeepTurn(item_id, pcm):
                    self._feed.keep_turn(item_id, pcm)
                case fx.StopAnswer(response_id):
                    self._feed.stop(response_id)
                case fx.StartAnswer(response):
                    self._feed.answer(answer_request(self.state, response))
                case fx.Trim(upto):
                    await self.writer.trim(upto)
                case fx.Close():
                    await self._finish_close()
                case _:
                    assert_never(effect)

    # --- the model's output ----------------------------------------------------

    async def _on_model(self, message: mb.ModelMessage) -> None:
        """Step what the model's feed posted; output the core finds stale
        never reaches the log."""
        batch = self.writer.new_batch()
        state = self.state
        encoder = functools.partial(_response_encoder, self.codecs, state)
        match message:
            case mb.UnitOutputs():
                record_unit_outputs(batch, message, encoder)
            case mb.Chunks(response_id):
                record_answer_output(batch, message, self._feed.take(response_id), encoder)
            case mb.ModelFailed():
                record_model_failure(batch, message)
            case mb.StreamEnd(response_id):
                self._feed.forget(response_id)
                if record_stream_end(batch, message) and await self._commit(batch):
                    await self._run_heard(self.hearing.answer_ended())
                return
            case _:
                assert_never(message)
        await self._commit(batch)

    # --- attachments and the lease --------------------------------------------

    async def _on_resume(self, message: mb.Resume) -> None:
        request = message.request
        if not message.may_use(self.state.owner):
            message.done.set_exception(not_yours(request))
            return
        if (refused := inputs.resume_refusal(self.state, request)) is not None:
            message.done.set_exception(refused)
            return
        try:
            # A detached session's lease was let go; take it back unless
            # another replica took the session meanwhile (it is served there).
            await self.lease.take_back()
        except (SessionMoved, ProtocolError) as exc:
            message.done.set_exception(exc)
            return
        token = new_resume_token()
        batch = self.writer.new_batch()
        generation = inputs.record_resume(batch, self._holder(), token)
        if not await self._commit(batch):
            message.done.set_exception(
                ProtocolError("storage_unavailable", "could not record the resume")
            )
            return
        await self.socket.replace(generation)
        self.socket.attach(message.attachment, generation)
        self.lifecycle.to(Phase.ATTACHED)
        self.last_activity = time.monotonic()
        await self.socket.greet_resumed(token, request.last_received_server_event_seq)
        message.done.set_result(None)

    async def _on_detach(self, generation: int) -> None:
        if await self.socket.take(generation) is None:
            return
        self.lifecycle.to(Phase.DETACHED, at=time.monotonic())
        batch = self.writer.new_batch()
        inputs.record_detach(batch, self._holder())
        if await self._commit(batch):
            await self.lease.release()

    async def _on_suspend(self) -> None:
        """Hand the session over to the next process: detach, tell the client to resume."""
        self._feed.stop_all()
        attachment = await self.socket.take()
        if attachment is not None:
            batch = self.writer.new_batch()
            inputs.record_detach(batch, self._holder())
            await self._commit(batch)
            await attachment.close(
                CloseCode.SERVICE_RESTART, "server restarting: resume the session"
            )
        await self.lease.release()
        self.lifecycle.to(Phase.SUSPENDED)

    async def _leave(self, status: LeaseStatus) -> None:
        """The lease is another replica's now (``lost``) or is asked for
        (``handoff``): stop writing, tell the socket, let the lease go."""
        if not self.lifecycle.serving:
            return
        self._feed.stop_all()
        await self.socket.move_away()
        if status == "handoff":
            await self.lease.release()
        self.lifecycle.to(Phase.MOVED)

    async def _on_end(self, reason: CloseReason) -> None:
        """Expiry or server shutdown: tell the client why, then close."""
        if self.writer.dirty:
            self._end_requested = False  # the store is still down: the reaper asks again
            return
        if self.state.closed_reason is not None:
            return
        batch = self.writer.new_batch()
        aborted = inputs.record_end(batch, reason)
        if not await self._commit(batch):
            self._end_requested = False  # not recorded: the reaper asks again
            return
        if aborted:
            self._feed.stop(aborted)
        await self._finish_close()

    async def _finish_close(self) -> None:
        if self.lifecycle.serving:
            self.lifecycle.to(Phase.CLOSED)
        await self.socket.close_after_drain(self.state.closed_reason or "closed")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _snapshot(writer: LogWriter, capabilities: Capabilities) -> SessionObject:
    return session_object(writer.state, capabilities)


def _response_encoder(
    codecs: SessionCodecs, state: SessionState, response_id: str
) -> Callable[[bytes, int], bytes] | None:
    return codecs.stream_encoder(response_id, output_format(state, response_id))
