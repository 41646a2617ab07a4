"""How a session hears: server VAD, transcripts, and speech over the answer.

This is the part of a session that listens. It turns the model's
voice-activity scores into speech decisions, ends turns when the speech
stops (under ``semantic_vad``, when the model's end-of-turn model says the
turn is over at a pause), keeps partial transcripts flowing while the user speaks, and
resolves speech over an answer by ``overlap_policy`` and, on the duplex
wire, by its words: sustained speech that is short and all acknowledgements
("mm-hm", "okay", the server's ``--backchannel-words``) is held until the
recogniser has heard it, then dropped like a short remark
(``turns.overlap_verdict``). It never writes to the
session: each decision is a command (``core/heard.py``) the actor runs
through the same pipeline as a client's event, so it is in the log first;
the actor tells it which of them were recorded (:meth:`Hearing.recorded`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Literal

from msgspec import UNSET

from duplex_server.audio import pcm16_rms
from duplex_server.sessions.core.commands import HeardTurn, next_user_item_id
from duplex_server.sessions.core.config import (
    SERVED_BY_SERVER_VAD,
    tells_transcripts,
    transcript_deltas_add_up,
)
from duplex_server.sessions.core.heard import (
    DeferredTurnDue,
    HeardCommand,
    InputTrimmed,
    OverlapHinted,
    OverlapResolved,
    PartialHeard,
    RemarkDropped,
    SpeechStart,
    TurnEnded,
    TurnJudged,
)
from duplex_server.sessions.core.model_port import (
    NO_HINTS,
    EndsTurns,
    Listening,
    ModelPort,
    SpeechScorer,
    TranscriptionError,
    TranscriptionHints,
    TurnModelUnavailable,
)
from duplex_server.sessions.core.records import AudioBody
from duplex_server.sessions.core.state import InputBuffer, SessionState
from duplex_server.sessions.core.transcripts import reconcile, stable_prefix
from duplex_server.sessions.core.turns import (
    BACKCHANNEL_WORDS,
    Backchannels,
    HintedOverlap,
    Overlap,
    OverlapReason,
    Transition,
    VadGate,
    eagerness_of,
    overlap_verdict,
    turn_finished,
)
from duplex_server.sessions.runtime import mailbox as mb
from protocol.errors import ProtocolError
from protocol.session_config import TurnDetection

log = logging.getLogger(__name__)

# A partial transcript re-decodes the whole utterance so far, so they come
# further apart as it grows: after PARTIAL_EVERY_MS more audio, or half again
# what the last one heard, whichever is more (a long utterance costs a few
# partials, not one per half second: its partials' work is linear in it).
PARTIAL_EVERY_MS = 500.0
PARTIAL_GROWTH = 0.5
TRIM_SLACK_MS = 1000.0  # silence beyond the prefix padding before it is trimmed
# Silence after speech this long starts the turn's final transcript early,
# while the VAD still waits out its hangover (silence_duration_ms): if the
# speech does not resume, the transcript is ready when the turn ends.
SPECULATE_AFTER_MS = 120.0
# While speech over the answer is held for its words, its audio is decoded
# again once this much more has come (one decode at a time), so an
# interruption that opens with "okay, but..." is cut by its next words.
# Each decode's words come back through the mailbox; at the stop, speech not
# yet heard to its end waits for them (Hearing._hear_to_the_end).
HELD_DECODE_EVERY_MS = 100.0
DEFAULT_BACKCHANNELS = Backchannels.parse(BACKCHANNEL_WORDS)


@dataclass
class _HeldDecode:
    """A decode of held speech over the answer: the input buffer's audio up
    to ``until_ms`` (input timeline), started at ``started_s`` (perf clock)."""

    task: asyncio.Task[str]
    until_ms: float
    started_s: float


@dataclass
class _Candidate:
    """A final transcript started at a pause in the speech; the turn's own
    when the speech ended at ``speech_end_ms`` (it did not resume)."""

    item_id: str
    speech_end_ms: float
    task: asyncio.Task[str]

    def serves(self, item_id: str, speech_end_ms: float | None) -> bool:
        """Whether it is the transcript of this item's speech ending there."""
        return (self.item_id, self.speech_end_ms) == (item_id, speech_end_ms)


class Hearing:
    """One session's ears. ``post`` queues a message on the session's
    mailbox (partial transcripts and held speech's words come back that
    way, off the actor)."""

    def __init__(
        self,
        model: ModelPort,
        post: Callable[[mb.HeardMessage], None],
        backchannels: Backchannels = DEFAULT_BACKCHANNELS,
    ) -> None:
        self._model = model
        self._post = post
        self._backchannels = backchannels
        # The newest decode of held speech over the answer (in flight or done),
        # how much of the input buffer the last one started covered, and the
        # longest one took (start to words, queueing included): the stop's
        # wait for words is at most that long.
        self._held_decode: _HeldDecode | None = None
        self._held_covered_ms = 0.0
        self._held_decode_s: float | None = None
        self._vad: VadTracker | None = None  # server VAD under the current settings
        self._overlap: Overlap | None = None  # user speech over the current answer
        self._hinted: HintedOverlap | None = None  # the same, without server VAD
        self._reply_pending = False  # a turn deferred (listen_only) until the answer ends
        # Partial transcripts of the speech going on: the task in flight, how much
        # audio the last one covered, and what the client was told (for which item).
        self._partial_task: asyncio.Task[None] | None = None
        self._partial_at_ms = 0.0
        # The utterance partials were told of: its item and its first audio
        # record (a cleared buffer's next utterance becomes the same item).
        self._partial_item: tuple[str, int] = ("", 0)
        self._partial_text = ""
        self._partial_hypothesis = ""  # the newest partial decode, told or not
        self._candidate: _Candidate | None = None

    async def transcribe(self, state: SessionState, speech_end_ms: float | None) -> HeardTurn:
        """What the model hears in the input buffer, before its commit is
        built (so ``transcription.completed`` takes its place in the commit's
        events); a failed recognition is the error to tell the client.
        ``speech_end_ms``: server VAD ended the turn there, so a transcript
        started at the pause after it is this turn's (only silence followed)."""
        listening = self._model.listening
        buffer = state.input
        if listening is None or not buffer.chunks:
            return HeardTurn()
        started = time.perf_counter()
        candidate, self._candidate = self._candidate, None
        try:
            if candidate is not None and candidate.serves(next_user_item_id(state), speech_end_ms):
                text = await candidate.task
            else:
                if candidate is not None:
                    candidate.task.cancel()
                pcm = b"".join(buffer.chunks)
                text = await listening.transcribe(pcm, buffer.sample_rate_hz, hints=_hints(state))
        except TranscriptionError as exc:
            return HeardTurn(error=ProtocolError("engine_error", str(exc)))
        told = self._told(state)
        waited_ms = (time.perf_counter() - started) * 1000
        if not transcript_deltas_add_up(state.config):
            return HeardTurn(text, wait_ms=waited_ms)  # captions: the final replaces them
        return HeardTurn(reconcile(told, text), wait_ms=waited_ms, told=told)

    def _told(self, state: SessionState) -> str:
        """What partials told of the utterance in the buffer now."""
        return self._partial_text if self._partial_item == _utterance(state) else ""

    async def after_append(
        self, state_of: Callable[[], SessionState], audio: AudioBody
    ) -> AsyncGenerator[HeardCommand]:
        """What hearing decides about one chunk just appended, a command at a
        time: the speech transitions the VAD heard in it, speech over the
        answer judged from hints, then the trim or partial transcript its
        end calls for. Each is decided on the session as the command before
        it left it (``state_of``), so the caller steps each command before it
        asks for the next."""
        async for transition in self._heard(state_of(), audio):
            if transition.kind == "speech_paused":
                async for judged in self._judge(state_of, transition):
                    yield judged
                continue
            async for decided in self._decisions(state_of, transition):
                yield decided
        if (held := self.held_overlap(state_of())) is not None:
            yield held
        if (hinted := self.overlap_hints(state_of(), audio)) is not None:
            yield hinted
        if (after := self.after_audio(state_of())) is not None:
            yield after

    async def hear(self, state: SessionState, audio: AudioBody) -> list[Transition]:
        """Server VAD: score the chunk just appended (its end is the buffer's
        end); the speech starts and stops it completed, in order."""
        return [transition async for transition in self._heard(state, audio)]

    async def _heard(self, state: SessionState, audio: AudioBody) -> AsyncGenerator[Transition]:
        """The transitions of :meth:`hear`, each before the gate hears the
        next window (a pause the end-of-turn model ends stops the gate there)."""
        detection = state.config.turn_detection
        listening = self._model.listening
        if listening is None or detection is None or detection.type not in SERVED_BY_SERVER_VAD:
            self._vad = None
            return
        origin_ms = state.input.end_ms - audio.duration_ms
        barge_in_ms = state.config.overlap_barge_in_ms
        if self._vad is None or (self._vad.settings, self._vad.barge_in_ms) != (
            detection,
            barge_in_ms,
        ):
            long_ms = self._backchannels.max_ms if self._backchannels.enabled else None
            self._vad = VadTracker(
                detection, listening.open_scorer(), origin_ms, barge_in_ms, long_ms
            )
        async for transition in self._vad.hear(audio.pcm, audio.sample_rate_hz):
            yield transition

    async def _decisions(
        self, state_of: Callable[[], SessionState], transition: Transition
    ) -> AsyncGenerator[HeardCommand]:
        """What a transition leads to: at a stop, held speech over the answer
        is settled first (a cut before the turn it becomes), then decided."""
        if transition.kind == "speech_stopped" and (
            settled := await self.settle_held(state_of(), transition)
        ):
            yield settled
        if (then := self.decide(state_of(), transition)) is not None:
            yield then

    def decide(self, state: SessionState, transition: Transition) -> HeardCommand | None:
        """What a speech transition leads to, given the session as it is now
        (the transitions before it already applied; a stop after held speech
        over the answer was settled first, :meth:`settle_held`)."""
        detection = state.config.turn_detection
        if detection is None:
            return None
        if transition.kind == "speech_started":
            response = state.response
            if response is None:
                return SpeechStart(transition.at_ms)
            self._overlap = Overlap(transition.at_ms, response.id)
            cut = state.config.openai_semantics and self._may_barge_in(state, detection)
            if cut:
                self._overlap.action = "barge_in"
            return SpeechStart(transition.at_ms, cut_answer=cut)
        if transition.kind == "speech_sustained":
            return self._resolve_overlap(state, transition, detection)
        if transition.kind == "speech_long":
            return self._held_too_long(state, transition)
        if transition.kind == "speech_paused":
            return None  # semantic_vad: the end-of-turn model decides (_judge)
        return self._end_of_speech(state, transition, detection)

    async def _judge(
        self, state_of: Callable[[], SessionState], pause: Transition
    ) -> AsyncGenerator[HeardCommand]:
        """semantic_vad: a pause after speech asks the end-of-turn model about
        the turn so far; its word is logged (TurnJudged) and, if the turn is
        over, the turn ends there. Unjudged (the model busy or failed), the
        turn waits for the eagerness's longest wait."""
        state, tracker = state_of(), self._vad
        detection = state.config.turn_detection
        ending = self._model.turn_ending if isinstance(self._model, EndsTurns) else None
        if tracker is None or detection is None or ending is None:
            return
        eagerness = eagerness_of(detection)
        if eagerness is None or not state.input.chunks or not tracker.speaking:
            return
        if self._overlap is not None and self._overlap.action is None:
            # A remark over the answer, not a turn: it ends at its pause.
            async for decided in self._decisions(state_of, tracker.stop()):
                yield decided
            return
        buffer = state.input
        try:
            probability = await ending.probability(
                speech_until(buffer, pause.at_ms), buffer.sample_rate_hz
            )
        except TurnModelUnavailable as exc:
            log.warning("end-of-turn model unavailable, the turn waits: %s", exc)
            return
        finished = turn_finished(probability, eagerness)
        yield TurnJudged(pause.at_ms, round(probability, 4), finished)
        if not finished or tracker is not self._vad or not tracker.speaking:
            return
        async for ended in self._decisions(state_of, tracker.stop()):
            yield ended

    def overlap_hints(self, state: SessionState, audio: AudioBody) -> HeardCommand | None:
        """Without server VAD, speech over the answer is judged chunk by
        chunk from what the client says of it (its hints), else from the
        audio's energy against ``overlap_silence_rms``."""
        config = state.config
        response = state.response
        served = config.turn_detection is not None and self._vad is not None
        if served or response is None:
            return None
        if self._hinted is None or (self._hinted.short_ack_ms, self._hinted.barge_in_ms) != (
            config.overlap_short_ack_ms,
            config.overlap_barge_in_ms,
        ):
            self._hinted = HintedOverlap(config.overlap_short_ack_ms, config.overlap_barge_in_ms)
        speech = audio.is_speech
        if speech is None:
            speech = pcm16_rms(audio.pcm) >= config.overlap_silence_rms
        decided = self._hinted.push(
            response.id,
            audio.duration_ms,
            speech,
            audio.overlap_hint,  # type: ignore[arg-type]  # validated at the edge
            self._may_barge_in(state, None),
        )
        if decided is None:
            return None
        return OverlapHinted(decided[0], decided[1], response.id)

    def after_audio(self, state: SessionState) -> HeardCommand | None:
        """Once the chunk's transitions are applied: trim the silence kept
        between turns, or start a partial transcript of the speech going on."""
        detection = state.config.turn_detection
        listening = self._model.listening
        if self._vad is None or detection is None or listening is None:
            return None
        if state.user_speaking:
            if not self._maybe_speculate(state, listening):
                self._maybe_partial(state, listening)
            return None
        # Between turns the buffer keeps only the prefix padding: a session
        # that hears only silence holds a bounded buffer, not all of it.
        keep_ms = float(detection.prefix_padding_ms)  # type: ignore[arg-type]  # merged: always set
        if state.input.audio_ms < keep_ms + TRIM_SLACK_MS:
            return None
        return InputTrimmed(keep_ms)

    def partial(self, state: SessionState, message: mb.Partial) -> HeardCommand | None:
        """A partial transcript came back: tell the client what was heard, as
        an extension of what it was told before. On the OpenAI endpoint and
        in a transcription session only the words this decode and the one
        before agree on (core/transcripts.py: the deltas must add up to the
        final transcript); the duplex wire's partials are live captions the
        final replaces, so they run ahead."""
        current = next_user_item_id(state)
        if not state.user_speaking or message.item_id != current:
            return None
        utterance = _utterance(state)
        previous = self._partial_hypothesis if self._partial_item == utterance else ""
        if self._partial_item != utterance:
            self._partial_item, self._partial_text = utterance, ""
        self._partial_hypothesis = message.text
        if not tells_transcripts(state.config):
            return None
        told = self._partial_text
        adds_up = transcript_deltas_add_up(state.config)
        stable = stable_prefix(previous, message.text) if adds_up else message.text
        if len(stable) <= len(told) or not stable.startswith(told):
            return None
        return PartialHeard(current, stable[len(told) :])

    def answer_ended(self) -> HeardCommand | None:
        """An answer finished: answer the turn it deferred (listen_only), if any."""
        if not self._reply_pending:
            return None
        self._reply_pending = False
        return DeferredTurnDue()

    def recorded(self, command: HeardCommand) -> None:
        """The command reached the log: remember what the client was told."""
        if isinstance(command, PartialHeard) and command.item_id == self._partial_item[0]:
            self._partial_text += command.delta  # partial() keyed it to this utterance
        elif isinstance(command, TurnEnded):
            self._reply_pending = command.deferred

    def close(self) -> None:
        """The session is over: transcripts in flight are dropped."""
        if self._partial_task is not None:
            self._partial_task.cancel()
        if self._held_decode is not None:
            self._held_decode.task.cancel()
        if self._candidate is not None:
            self._candidate.task.cancel()

    def _maybe_speculate(self, state: SessionState, listening: Listening) -> bool:
        """At a pause of ``SPECULATE_AFTER_MS`` in the speech, start the
        turn's final transcript (one per pause: speech that resumes makes
        the last one stale, and the next pause replaces it); whether one is
        running."""
        tracker = self._vad
        if tracker is None:
            return False
        speech_end = tracker.speech_end_ms
        candidate = self._candidate
        running = candidate is not None and not candidate.task.done()
        if tracker.heard_until_ms - speech_end < SPECULATE_AFTER_MS:
            return running
        item_id = next_user_item_id(state)
        if candidate is not None:
            if candidate.serves(item_id, speech_end):
                return running
            # Stale: dropped from the queue if it waits there, ignored if it runs.
            candidate.task.cancel()
        buffer = state.input
        pcm, rate, hints = b"".join(buffer.chunks), buffer.sample_rate_hz, _hints(state)
        task = asyncio.get_running_loop().create_task(listening.transcribe(pcm, rate, hints=hints))
        task.add_done_callback(_retrieve)
        self._candidate = _Candidate(item_id, speech_end, task)
        return True

    def _maybe_partial(self, state: SessionState, listening: Listening) -> None:
        """While the user speaks, transcribe what is buffered every
        ``PARTIAL_EVERY_MS`` of audio, off the actor (one at a time); the
        result comes back through the mailbox."""
        buffer = state.input
        if self._partial_task is not None and not self._partial_task.done():
            return
        if not listening.can_take_partial():
            return
        if buffer.audio_ms < self._partial_at_ms:
            self._partial_at_ms = 0.0  # a new utterance
        if buffer.audio_ms - self._partial_at_ms < max(
            PARTIAL_EVERY_MS, PARTIAL_GROWTH * self._partial_at_ms
        ):
            return
        self._partial_at_ms = buffer.audio_ms
        item_id = next_user_item_id(state)
        pcm, rate, hints = b"".join(buffer.chunks), buffer.sample_rate_hz, _hints(state)

        async def transcribe() -> None:
            try:
                text = await listening.transcribe(pcm, rate, partial=True, hints=hints)
            except TranscriptionError:
                return  # logged by the stage; the final transcript will say it
            self._post(mb.Partial(item_id, text))

        self._partial_task = asyncio.get_running_loop().create_task(transcribe())

    def _may_barge_in(self, state: SessionState, detection: TurnDetection | None) -> bool:
        """OpenAI's endpoint cuts the answer when speech starts, as OpenAI does
        and its clients expect (Pipecat stops playing at ``speech_started``);
        the duplex wire waits for sustained speech and drops short remarks."""
        return (
            state.config.overlap_policy == "barge_in_on_speech"
            and (detection is None or detection.interrupt_response is not False)
            and self._model.capabilities.supports_barge_in
        )

    def _resolve_overlap(
        self, state: SessionState, transition: Transition, detection: TurnDetection
    ) -> HeardCommand | None:
        """Speech over the answer lasted the barge-in threshold: act on the
        policy, or, on the duplex wire with a recogniser, hold it for its
        words (:meth:`held_overlap` decodes them)."""
        overlap = self._overlap
        if overlap is None or overlap.action is not None:
            return None
        listens = self._backchannels.enabled and self._model.listening is not None
        if listens and not state.config.openai_semantics:
            overlap.held = True
            return None
        overlap.action = "barge_in" if self._may_barge_in(state, detection) else "listen"
        overlap_ms = transition.at_ms - overlap.started_ms
        return OverlapResolved(overlap.action, overlap_ms, overlap.response_id)

    def held_overlap(self, state: SessionState) -> HeardCommand | None:
        """Held speech over the answer, after each chunk and each decode of
        it: decided as soon as its words say it is not an acknowledgement (or
        the answer it was over ended); while undecided, its audio is decoded
        again as it grows."""
        overlap, listening = self._overlap, self._model.listening
        if overlap is None or not overlap.held or overlap.action is not None or listening is None:
            return None
        overlap_ms = self._vad.speech_end_ms - overlap.started_ms if self._vad else 0.0
        decided = self._held_verdict(state, overlap, overlap_ms, ended=False)
        if decided is not None:
            return decided
        self._decode_held(state, listening)
        return None

    def overlap_heard(self, state: SessionState, message: mb.OverlapHeard) -> HeardCommand | None:
        """A decode of held speech came back (through the mailbox, so its
        words decide whether or not the client streams on): take its words
        and decide, as after a chunk."""
        overlap = self._overlap
        if overlap is None or (overlap.response_id, overlap.started_ms) != (
            message.response_id,
            message.started_ms,
        ):
            return None  # an overlap already settled
        _take_words(overlap, message.text, message.until_ms)
        return self.held_overlap(state)

    async def settle_held(self, state: SessionState, stop: Transition) -> HeardCommand | None:
        """Held speech over the answer stopped: all acknowledgements, it is
        dropped at the stop (:meth:`_end_of_speech`); else it cuts the
        answer (or is listened to) before it becomes the turn. Its words
        not yet heard to its end, it waits for them first (bounded)."""
        overlap = self._overlap
        if overlap is None or not overlap.held or overlap.action is not None:
            return None
        overlap_ms = stop.at_ms - overlap.started_ms
        await self._hear_to_the_end(state, overlap, stop.at_ms, overlap_ms)
        return self._held_verdict(state, overlap, overlap_ms, ended=True)

    async def _hear_to_the_end(
        self, state: SessionState, overlap: Overlap, end_ms: float, overlap_ms: float
    ) -> None:
        """At the stop, held speech whose words were not heard to its end
        (``end_ms``) waits for the decode in flight, or for one started now
        on all of it: for at most one decode's time (the longest a decode of
        this session's took, start to words) and only while the speech plus
        the wait stay within ``--backchannel-max-ms`` (longer, it is no
        acknowledgement whatever its words). Only this session's actor
        waits; the decode runs on the recogniser's stage, as before. Without
        the wait, a decode still running at the stop left "okay" unheard,
        and it cut the answer."""
        listening = self._model.listening
        budget_s = (self._backchannels.max_ms - overlap_ms) / 1000
        if listening is None or budget_s <= 0:
            return
        decode = self._held_decode
        if decode is not None and decode.task.done():
            _take_decoded(overlap, decode)  # its message may still wait in the mailbox
            decode = None
        if overlap.heard_until_ms >= end_ms:
            return
        if self._backchannels.all_backchannel(overlap.words or "") is False:
            return  # heard enough: not an acknowledgement
        if decode is None:
            self._held_covered_ms = 0.0  # whatever came since the last one
            self._decode_held(state, listening)
            decode = self._held_decode
            if decode is None:
                return
        wait_s = budget_s if self._held_decode_s is None else min(budget_s, self._held_decode_s)
        await asyncio.wait({decode.task}, timeout=wait_s)  # not cancelled on a timeout
        _take_decoded(overlap, decode)

    def _held_too_long(self, state: SessionState, transition: Transition) -> HeardCommand | None:
        """Held speech lasted longer than an acknowledgement: the length decides."""
        overlap = self._overlap
        if overlap is None or not overlap.held or overlap.action is not None:
            return None
        overlap_ms = transition.at_ms - overlap.started_ms
        return self._held_verdict(state, overlap, overlap_ms, ended=False)

    def _held_verdict(
        self, state: SessionState, overlap: Overlap, overlap_ms: float, ended: bool
    ) -> HeardCommand | None:
        """The held overlap's verdict (``turns.overlap_verdict``) as a command;
        None while it holds, or when it ended as a backchannel (the stop's
        RemarkDropped says so)."""
        response = state.response
        if response is None or response.id != overlap.response_id:
            verdict: str = "speech"
            reason: OverlapReason | None = "answer_ended"
            action: Literal["barge_in", "listen"] = "listen"
        else:
            verdict, reason = overlap_verdict(self._backchannels, overlap_ms, overlap.words, ended)
            detection = state.config.turn_detection
            action = "barge_in" if self._may_barge_in(state, detection) else "listen"
        if verdict == "hold":
            return None
        overlap.held = False
        self._drop_held_decode()
        if verdict == "backchannel":
            overlap.reason = reason or ""
            return None
        overlap.action = action
        words = overlap.words if reason == "not_a_backchannel" else None
        return OverlapResolved(action, overlap_ms, overlap.response_id, reason or "", words)

    def _decode_held(self, state: SessionState, listening: Listening) -> None:
        """Decode the held speech (all the buffer holds of it) off the actor,
        one decode at a time, again once ``HELD_DECODE_EVERY_MS`` more came;
        its words come back through the mailbox (:meth:`overlap_heard`).
        It does not wait for the recogniser to be idle (as partials do): the
        answer's fate waits on it, and it is short."""
        buffer, overlap = state.input, self._overlap
        running = self._held_decode is not None and not self._held_decode.task.done()
        if running or not buffer.chunks or overlap is None:
            return
        if buffer.audio_ms < self._held_covered_ms:
            self._held_covered_ms = 0.0  # a new utterance
        if self._held_covered_ms and buffer.audio_ms - self._held_covered_ms < HELD_DECODE_EVERY_MS:
            return
        self._held_covered_ms = buffer.audio_ms
        pcm, rate, hints = b"".join(buffer.chunks), buffer.sample_rate_hz, _hints(state)
        task = asyncio.get_running_loop().create_task(
            listening.transcribe(pcm, rate, partial=True, hints=hints)
        )
        decode = _HeldDecode(task, buffer.end_ms, time.perf_counter())
        response_id, started_ms = overlap.response_id, overlap.started_ms

        def heard(task: asyncio.Task[str]) -> None:
            if task.cancelled() or task.exception() is not None:
                return  # a failure was logged by the stage; the length decides
            took_s = time.perf_counter() - decode.started_s
            self._held_decode_s = max(self._held_decode_s or 0.0, took_s)
            words = task.result()
            self._post(
                mb.OverlapHeard(response_id, started_ms, words, decode.until_ms, decode.started_s)
            )

        task.add_done_callback(heard)
        self._held_decode = decode

    def _drop_held_decode(self) -> None:
        if self._held_decode is not None:
            self._held_decode.task.cancel()
        self._held_decode, self._held_covered_ms = None, 0.0

    def _end_of_speech(
        self, state: SessionState, transition: Transition, detection: TurnDetection
    ) -> HeardCommand:
        overlap, self._overlap = self._overlap, None
        if overlap is not None and overlap.held:
            self._drop_held_decode()  # settle_held did not run (a direct caller)
        if overlap is not None and overlap.action is None:
            overlap_ms = transition.at_ms - overlap.started_ms
            words = overlap.words if overlap.reason == "backchannel_words" else None
            return RemarkDropped(
                transition.at_ms, overlap_ms, overlap.response_id, overlap.reason, words
            )
        # Under listen_only the turn waits for the answer to end (then it is answered).
        deferred = overlap is not None and overlap.action == "listen"
        deferred = deferred and state.response is not None
        respond = detection.create_response if detection.create_response is not UNSET else None
        return TurnEnded(transition.at_ms, response_create=respond, deferred=deferred)


def _hints(state: SessionState) -> TranscriptionHints:
    """The session's ``input_audio_transcription`` language and prompt."""
    settings = state.config.input_audio_transcription
    if settings is None:
        return NO_HINTS
    return TranscriptionHints(settings.heard_language(), settings.heard_prompt())


def _take_words(overlap: Overlap, text: str, until_ms: float) -> None:
    """A decode of held speech up to ``until_ms``: its words, unless a decode
    of more of it was taken already."""
    if until_ms >= overlap.heard_until_ms:
        overlap.words, overlap.heard_until_ms = text, until_ms


def _take_decoded(overlap: Overlap, decode: _HeldDecode) -> None:
    """The words of a decode that has come back (a failed one has none)."""
    task = decode.task
    if task.done() and not task.cancelled() and task.exception() is None:
        _take_words(overlap, task.result(), decode.until_ms)


def _retrieve(task: asyncio.Task[str]) -> None:
    """A speculative transcript nobody awaited: its failure was logged by
    the stage; retrieving it keeps asyncio from reporting it again."""
    if not task.cancelled():
        task.exception()


class VadTracker:
    """A session's scorer (the model's, stateful) and gate under one set of
    settings; new settings start a new tracker."""

    def __init__(
        self,
        settings: TurnDetection,
        scorer: SpeechScorer,
        origin_ms: float,
        barge_in_ms: float,
        long_ms: float | None = None,
    ) -> None:
        self.settings = settings
        self.barge_in_ms = barge_in_ms
        self._scorer = scorer
        self._gate = VadGate(settings, scorer.window_ms, barge_in_ms, long_ms)
        self._origin_ms = origin_ms  # input timeline position of the scorer's 0
        self.heard_until_ms = origin_ms  # the end of the last window scored

    @property
    def speech_end_ms(self) -> float:
        """Where the speech going on was last heard."""
        return self._gate.last_speech_end_ms

    @property
    def speaking(self) -> bool:
        return self._gate.speaking

    def stop(self) -> Transition:
        """The end-of-turn model ended the turn at its pause."""
        return self._gate.stop()

    async def hear(self, pcm16: bytes, sample_rate_hz: int) -> AsyncGenerator[Transition]:
        """The chunk's windows scored at once, heard by the gate one at a time:
        the caller acts on each transition before the next window."""
        for end_ms, probability in await self._scorer.score(pcm16, sample_rate_hz):
            self.heard_until_ms = self._origin_ms + end_ms
            for transition in self._gate.push(self.heard_until_ms, probability):
                yield transition


def _utterance(state: SessionState) -> tuple[str, int]:
    """The utterance in the input buffer: the item it will become and its
    first audio record."""
    return next_user_item_id(state), state.input.first_seq


def speech_until(buffer: InputBuffer, end_ms: float) -> bytes:
    """The turn's audio up to ``end_ms`` on the input timeline (where its
    speech last ended), without the pause after it: Smart Turn hears a
    trailing pause as an end, whatever was said before it (measured on the
    bench's recordings cut mid-sentence: 200 ms of the recording's own floor
    after the cut made it call 78 % of the cuts finished, none of it 67 %)."""
    pcm = b"".join(buffer.chunks)
    start_ms = buffer.end_ms - buffer.audio_ms
    cut = int((end_ms - start_ms) * buffer.sample_rate_hz / 1000) * 2
    return pcm[:cut] if 0 < cut < len(pcm) else pcm
