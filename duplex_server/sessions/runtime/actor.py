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
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Callable
from typing import assert_never

from duplex_server import metrics
from duplex_server.sessions.core import effects as fx
from duplex_server.sessions.core import server_inputs as inputs
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import ModelFacts, check_session_patch
from duplex_server.sessions.core.config import merge_config
from duplex_server.sessions.core.heard import HeardCommand, TurnEnded
from duplex_server.sessions.core.model_names import ModelNames, opening_model
from duplex_server.sessions.core.model_output import (
    primed_setup,
    record_answer_output,
    record_model_failure,
    record_stream_end,
    record_unit_outputs,
)
from duplex_server.sessions.core.model_port import ModelPort
from duplex_server.sessions.core.pipeline import Command, admit, apply
from duplex_server.sessions.core.records import AudioBody, CallBody, CloseReason, Record
from duplex_server.sessions.core.state import SessionState, initial_state
from duplex_server.sessions.core.turns import Backchannels
from duplex_server.sessions.log.store import LogError, SessionLog
from duplex_server.sessions.log.tokens import new_resume_token
from duplex_server.sessions.runtime import log_context
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.actor_settings import ActorSettings
from duplex_server.sessions.runtime.answer_timing import AnswerTiming
from duplex_server.sessions.runtime.attachment import Attachment
from duplex_server.sessions.runtime.codecs import SessionCodecs
from duplex_server.sessions.runtime.hearing import Hearing
from duplex_server.sessions.runtime.idle_timer import IdleTimer
from duplex_server.sessions.runtime.input_budget import InputBudget
from duplex_server.sessions.runtime.input_preparation import InputPreparation
from duplex_server.sessions.runtime.journal import Journal
from duplex_server.sessions.runtime.lease import SessionLease
from duplex_server.sessions.runtime.lifecycle import Lifecycle, Phase
from duplex_server.sessions.runtime.log_writer import LogWriter
from duplex_server.sessions.runtime.mailbox import OwnerCheck, anyone
from duplex_server.sessions.runtime.model_feed import open_feed
from duplex_server.sessions.runtime.performer import Performer
from duplex_server.sessions.runtime.recovery import media_bytes, recent_turn_audio, stepped_units
from duplex_server.sessions.runtime.retention import AudioRetention
from duplex_server.sessions.runtime.socket_changes import SocketChanges
from duplex_server.sessions.runtime.socket_slot import SocketSlot
from duplex_server.sessions.runtime.turn_feed import RECENT_TURNS
from duplex_server.tracing import SessionTracer
from protocol.client_events import ClientEvent, InputAudioAppend, InputAudioCommit, SessionResume
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate

log = logging.getLogger(__name__)


class SessionActor:
    def __init__(
        self,
        session_id: str,
        log_backend: SessionLog,
        model: ModelPort,
        settings: ActorSettings,
        on_closed: Callable[[str, str], None],
        tracer: SessionTracer | None = None,
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
            tracer,
        )
        self.socket = SocketSlot(session_id, self.journal, self.writer, model.capabilities)
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
            lambda: primed_setup(writer.state),
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
        self.hearing = Hearing(
            model,
            post,
            Backchannels.parse(settings.backchannel_words, settings.backchannel_max_ms),
        )
        self._facts = ModelFacts(model, self.names)
        self._prepare = InputPreparation(self.hearing, self.input_budget, self.codecs, self._feed)
        self._out = Performer(self.writer, self.socket, self._feed, self.lease, self.lifecycle)
        self._changes = SocketChanges(
            self.writer, self.socket, self._feed, self.lease, self.lifecycle, self._out
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
        call: CallBody | None = None,
    ) -> None:
        """Create the log, take the lease, announce ``session.created`` to the
        socket; ``call``: a phone call's ids and numbers, recorded first."""
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
            self.lease.holder(),
            patch,
            token,
            handshake=handshake,
            openai_semantics=openai_semantics,
            owner=owner,
            turn_detection_types=self.model.turn_detection_types,
            call=call,
        )
        if not await self._out.commit(batch):
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
        ended = inputs.record_restore(batch, self.lease.holder(), expired=downtime_s >= grace_s)
        if not await self._out.commit(batch):
            raise LogError(f"could not record the recovery of {self.session_id}")
        if ended:
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
                message = await self._mailbox.get()
                try:
                    await self._dispatch(message)
                finally:
                    # Counted until applied, not until taken: a heartbeat is
                    # answered at once only while none of its socket's
                    # commands is in flight.
                    if isinstance(message, mb.SOCKET_MESSAGES):
                        self._pending_client -= 1
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
                exit_reason = self.lifecycle.exit_reason(self.state.closed_reason, failed)
                if self.writer.tracer is not None:
                    self.writer.tracer.closed(exit_reason)
                self.closed.set()
                self._on_closed(self.session_id, exit_reason)

    async def _dispatch(self, message: mb.Message) -> None:
        # Every message heals a state a storage failure left wrong, not only
        # those that need the log: a detach, an end or a suspend also append,
        # and a batch built on the wrong state would not follow the log.
        if self.writer.dirty and not await self._out.heal() and isinstance(message, mb.NEEDS_LOG):
            await self._out.refuse_unrecorded(message)
            return
        if not self.lifecycle.serving:
            return  # the heal found the session closed, and closed its socket
        match message:
            case mb.Client() | mb.Reject() | mb.Heartbeat():
                await self._on_socket(message)
            case mb.Chunks() | mb.StreamEnd() | mb.UnitOutputs() | mb.ModelFailed():
                await self._on_model(message)
            case mb.Partial():
                await self._run_heard(self.hearing.partial(self.state, message))
            case mb.OverlapHeard():
                # A cut its words decide is timed from the chunk they were heard in.
                self.writer.input_at = message.heard_at
                try:
                    await self._run_heard(self.hearing.overlap_heard(self.state, message))
                finally:
                    self.writer.input_at = None
            case mb.Resume():
                if await self._changes.resume(message):
                    self.last_activity = time.monotonic()
            case mb.Detach():
                await self._changes.detach(message.generation)
            case mb.End():
                await self._on_end(message.reason)
            case mb.Suspend():
                await self._changes.suspend()
            case mb.LeaseLost():
                await self._out.leave(message.status)
            case _:
                assert_never(message)

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
                await self._out.reject(message.error)
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
        await self._out.perform(effects)
        if isinstance(event, InputAudioAppend):
            self._prepare.charge(batch)
            for record in batch.records:
                if isinstance(record.body, AudioBody):
                    self._feed.feed(record.body.pcm, record.body.sample_rate_hz)
            await self._hear(batch)

    async def _execute(self, command: Command) -> tuple[Batch, fx.Effects] | None:
        """Admit the command, prepare it, apply it and append its batch; None
        when it was refused (the client is told why) or could not be
        recorded. Admitted before it is prepared: a retried commit must not
        be transcribed again."""
        admitted = admit(self.state, command, self.model.capabilities)
        if isinstance(admitted, ProtocolError):
            await self._out.reject(admitted)
            return None
        prepared = await self._prepare.prepare(self.state, command)
        before = self.state.last_seq
        try:
            batch, effects = apply(self.state, admitted, self._facts, _now_ms(), prepared)
        except ProtocolError as err:
            if self.state.last_seq != before:
                await self.writer.refold()
            await self._out.reject(err)
            return None
        if not await self._out.commit(batch):
            return None
        return batch, effects

    async def _hear(self, batch: Batch) -> None:
        """Run what hearing decides about the chunk just appended, one
        command at a time (each sees the session as the last one left it)."""
        audio = next((r.body for r in batch.records if isinstance(r.body, AudioBody)), None)
        if audio is None:
            return
        decisions = self.hearing.after_append(lambda: self.state, audio)
        async with contextlib.aclosing(decisions) as heard:
            async for command in heard:
                await self._run_heard(command)
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
            await self._out.perform(done[1])

    # --- the model's output ----------------------------------------------------

    async def _on_model(self, message: mb.ModelMessage) -> None:
        """Step what the model's feed posted; output the core finds stale
        never reaches the log."""
        batch = self.writer.new_batch()
        state = self.state
        encoder = functools.partial(self.codecs.response_encoder, state)
        match message:
            case mb.UnitOutputs():
                record_unit_outputs(batch, message, encoder)
            case mb.Chunks(response_id):
                record_answer_output(batch, message, self._feed.take(response_id), encoder)
            case mb.ModelFailed():
                record_model_failure(batch, message)
            case mb.StreamEnd(response_id):
                self._feed.forget(response_id)
                if record_stream_end(batch, message) and await self._out.commit(batch):
                    await self._run_heard(self.hearing.answer_ended())
                return
            case _:
                assert_never(message)
        await self._out.commit(batch)

    # --- the session's end --------------------------------------------

    async def _on_end(self, reason: CloseReason) -> None:
        """Expiry or server shutdown: tell the client why, then close."""
        if self.writer.dirty:
            self._end_requested = False  # the store is still down: the reaper asks again
            return
        if self.state.closed_reason is not None:
            return
        batch = self.writer.new_batch()
        aborted = inputs.record_end(batch, reason)
        if not await self._out.commit(batch):
            self._end_requested = False  # not recorded: the reaper asks again
            return
        if aborted:
            self._feed.stop(aborted)
        await self._out.finish_close()


def _now_ms() -> int:
    return int(time.time() * 1000)
