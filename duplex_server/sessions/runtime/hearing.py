"""How a session hears: server VAD, transcripts, and speech over the answer.

The actor owns the session; this is the part of it that listens. It turns
the model's voice-activity scores into logged speech decisions, commits
turns when the speech stops, keeps partial transcripts flowing while the user
speaks, and resolves speech over an answer by ``overlap_policy``. Everything
it decides goes through the actor's batches, so it is in the log first.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from msgspec import UNSET

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import (
    Effects,
    HandlerContext,
    audio_commit,
    next_user_item_id,
    overlap_decision,
    respond_to_input,
    speech_transition,
)
from duplex_server.sessions.core.config import SERVED_BY_SERVER_VAD
from duplex_server.sessions.core.model_port import (
    Listening,
    ModelPort,
    SpeechScorer,
    TranscriptionError,
)
from duplex_server.sessions.core.records import AudioBody, DecisionBody
from duplex_server.sessions.core.state import SessionState
from duplex_server.sessions.core.turns import Overlap, Transition, VadGate
from duplex_server.sessions.runtime import mailbox as mb
from protocol.client_events import InputAudioCommit
from protocol.errors import ProtocolError
from protocol.server_events import InputTranscriptionDelta
from protocol.session_config import TurnDetection

PARTIAL_EVERY_MS = 500.0  # of buffered speech between partial transcripts
TRIM_SLACK_MS = 1000.0  # silence beyond the prefix padding before it is trimmed


class ActorCore(Protocol):
    """What hearing needs from its session actor."""

    state: SessionState
    model: ModelPort

    def new_batch(self) -> Batch: ...

    async def commit_batch(self, batch: Batch) -> bool: ...

    async def apply_effects(self, effects: Effects) -> None: ...

    async def reject(self, err: ProtocolError) -> None: ...

    def post(self, message: object) -> None: ...


class Hearing:
    def __init__(self, core: ActorCore) -> None:
        self._core = core
        self._vad: VadTracker | None = None  # server VAD under the current settings
        self._overlap: Overlap | None = None  # user speech over the current answer
        self._reply_pending = False  # a turn deferred (listen_only) until the answer ends
        # Partial transcripts of the speech going on: the task in flight, how much
        # audio the last one covered, and what the client was told (for which item).
        self._partial_task: asyncio.Task[None] | None = None
        self._partial_at_ms = 0.0
        self._partial_item = ""
        self._partial_text = ""

    async def transcribe_input(self) -> str:
        """What the model hears in the input buffer (before its commit is built,
        so ``transcription.completed`` takes its place in the commit fan-out)."""
        listening = self._core.model.listening
        buffer = self._core.state.input
        if listening is None or not buffer.chunks:
            return ""
        try:
            return await listening.transcribe(b"".join(buffer.chunks), buffer.sample_rate_hz)
        except TranscriptionError as exc:
            await self._core.reject(ProtocolError("engine_error", str(exc)))
            return ""  # the turn is committed without a transcript

    async def hear(self, batch: Batch) -> None:
        """Server VAD: score the chunk just appended; record speech starts and
        stops, and commit the turn when the speech stopped."""
        detection = self._core.state.config.turn_detection
        listening = self._core.model.listening
        if listening is None or detection is None or detection.type not in SERVED_BY_SERVER_VAD:
            self._vad = None
            return
        audio = next((r.body for r in batch.records if isinstance(r.body, AudioBody)), None)
        if audio is None:
            return
        origin_ms = self._core.state.input.end_ms - audio.duration_ms
        if self._vad is None or self._vad.settings != detection:
            self._vad = VadTracker(detection, listening.open_scorer(), origin_ms)
        for transition in await self._vad.hear(audio.pcm, audio.sample_rate_hz):
            await self._on_transition(transition, detection)
        if not self._core.state.user_speaking:
            await self._trim_silence(detection)
        else:
            self._maybe_partial(listening)

    def _maybe_partial(self, listening: Listening) -> None:
        """While the user speaks, transcribe what is buffered every
        ``PARTIAL_EVERY_MS`` of audio, off the actor (one at a time); the
        result comes back through the mailbox."""
        buffer = self._core.state.input
        if self._partial_task is not None and not self._partial_task.done():
            return
        if not listening.can_take_partial():
            return
        if buffer.audio_ms < self._partial_at_ms:
            self._partial_at_ms = 0.0  # a new utterance
        if buffer.audio_ms - self._partial_at_ms < PARTIAL_EVERY_MS:
            return
        self._partial_at_ms = buffer.audio_ms
        item_id = next_user_item_id(self._core.state)
        pcm, rate = b"".join(buffer.chunks), buffer.sample_rate_hz

        async def transcribe() -> None:
            try:
                text = await listening.transcribe(pcm, rate, partial=True)
            except TranscriptionError:
                return  # logged by the stage; the final transcript will say it
            self._core.post(mb.Partial(item_id, text))

        self._partial_task = asyncio.get_running_loop().create_task(transcribe())

    async def on_partial(self, message: mb.Partial) -> None:
        """Tell the client what was heard so far, as an extension of what it
        was told before (a revised hypothesis waits for the final transcript)."""
        current = next_user_item_id(self._core.state)
        if not self._core.state.user_speaking or message.item_id != current:
            return
        told = self._partial_text if self._partial_item == current else ""
        if len(message.text) <= len(told) or not message.text.startswith(told):
            return
        batch = self._core.new_batch()
        batch.emit(InputTranscriptionDelta(item_id=current, delta=message.text[len(told) :]))
        if await self._core.commit_batch(batch):
            self._partial_item, self._partial_text = current, message.text

    async def _trim_silence(self, detection: TurnDetection) -> None:
        """Between turns the buffer keeps only the prefix padding: a session
        that hears only silence holds a bounded buffer, not all of it."""
        keep_ms = float(detection.prefix_padding_ms)  # type: ignore[arg-type]  # merged: always set
        if self._core.state.input.audio_ms < keep_ms + TRIM_SLACK_MS:
            return
        batch = self._core.new_batch()
        batch.fact(DecisionBody(action="input_trimmed", audio_ms=keep_ms), origin="server")
        await self._core.commit_batch(batch)

    async def _on_transition(self, transition: Transition, detection: TurnDetection) -> None:
        if transition.kind == "speech_started":
            batch = self._core.new_batch()
            speech_transition(batch, transition)
            response, effects = self._core.state.response, None
            if response is not None:
                self._overlap = Overlap(transition.at_ms, response.id)
                if self._interrupts_at_speech_start(detection):
                    self._overlap.action = "barge_in"
                    effects = overlap_decision(batch, "barge_in", 0.0, response.id)
            if await self._core.commit_batch(batch) and effects is not None:
                await self._core.apply_effects(effects)
        elif transition.kind == "speech_sustained":
            await self._resolve_overlap(transition)
        else:
            await self._end_of_speech(transition, detection)

    def _may_barge_in(self, detection: TurnDetection) -> bool:
        return (
            self._core.state.config.overlap_policy == "barge_in_on_speech"
            and detection.interrupt_response is not False
            and self._core.model.capabilities.supports_barge_in
        )

    def _interrupts_at_speech_start(self, detection: TurnDetection) -> bool:
        """OpenAI's endpoint cuts the answer when speech starts, as OpenAI does
        and its clients expect (Pipecat stops playing at ``speech_started``);
        the duplex wire waits for sustained speech and drops short remarks."""
        return self._core.state.config.openai_semantics and self._may_barge_in(detection)

    async def _resolve_overlap(self, transition: Transition) -> None:
        """Speech over the answer lasted the barge-in threshold: act on the policy."""
        overlap = self._overlap
        detection = self._core.state.config.turn_detection
        if overlap is None or overlap.action is not None or detection is None:
            return
        barge = self._may_barge_in(detection)
        overlap.action = "barge_in" if barge else "listen"
        batch = self._core.new_batch()
        effects = overlap_decision(
            batch, overlap.action, transition.at_ms - overlap.started_ms, overlap.response_id
        )
        if await self._core.commit_batch(batch):
            await self._core.apply_effects(effects)

    async def _end_of_speech(self, transition: Transition, detection: TurnDetection) -> None:
        overlap, self._overlap = self._overlap, None
        if overlap is not None and overlap.action is None:
            batch = self._core.new_batch()  # a short remark over the answer: dropped
            speech_transition(batch, transition)
            overlap_ms = transition.at_ms - overlap.started_ms
            overlap_decision(batch, "drop", overlap_ms, overlap.response_id)
            await self._core.commit_batch(batch)
            return
        # Under listen_only the turn waits for the answer to end (then it is answered).
        defer = overlap is not None and overlap.action == "listen"
        defer = defer and self._core.state.response is not None
        transcript = await self.transcribe_input()
        batch = self._core.new_batch()
        speech_transition(batch, transition)
        respond = detection.create_response if detection.create_response is not UNSET else None
        commit = InputAudioCommit(response_create=False if defer else respond)
        effects = audio_commit(batch, commit, HandlerContext(self._core.model, transcript))
        if await self._core.commit_batch(batch):
            self._reply_pending = defer
            await self._core.apply_effects(effects)

    async def answer_ended(self) -> None:
        """An answer finished: answer the turn it deferred (listen_only), if any."""
        if not self._reply_pending:
            return
        self._reply_pending = False
        batch = self._core.new_batch()
        effects = respond_to_input(batch, self._core.model)
        if await self._core.commit_batch(batch):
            await self._core.apply_effects(effects)


class VadTracker:
    """A session's scorer (the model's, stateful) and gate under one set of
    settings; new settings start a new tracker."""

    def __init__(self, settings: TurnDetection, scorer: SpeechScorer, origin_ms: float) -> None:
        self.settings = settings
        self._scorer = scorer
        self._gate = VadGate(settings, scorer.window_ms)
        self._origin_ms = origin_ms  # input timeline position of the scorer's 0

    async def hear(self, pcm16: bytes, sample_rate_hz: int) -> list[Transition]:
        transitions: list[Transition] = []
        for end_ms, probability in await self._scorer.score(pcm16, sample_rate_hz):
            transitions += self._gate.push(self._origin_ms + end_ms, probability)
        return transitions
