"""Pipecat's OpenAI Realtime service (``pipecat-ai`` 1.14), unmodified, holding
conversations with the ``cascade`` model, driven through Pipecat's own test
harness (``pipecat.tests.utils.run_test``: no transport).

Everything enters the pipeline through ``run_test``'s ``frames_to_send``. That
sequence is a generator, so a script can wait for what the server said before
it sends more: it yields ``SleepFrame`` polls (``run_test`` awaits those) until
a condition holds, bounded by a timeout; a wait that times out ends the script,
``run_test`` sends its ``EndFrame`` and the test fails saying what it waited for.

Pipecat validates every server event it knows with its own pydantic models and
treats a failure, like any ``error`` event, as the end of the conversation; the
``wire`` fixture keeps what crossed the socket so a test says which event was
refused and why. It wraps two Pipecat internals (``events.parse_server_event``
and ``OpenAIRealtimeLLMService._ws_send``), which is one reason the dev extra
pins ``pipecat-ai[openai]==1.14.0``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMRunFrame,
    LLMTextFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.tests.utils import SleepFrame, run_test
from pipecat.turns.user_turn_processor import UserTurnProcessor
from pipecat.turns.user_turn_strategies import ExternalUserTurnStrategies

from duplex_server.audio import resample_pcm16
from duplex_server.engine.audio.sphinx import Sphinx
from tests.speech import ANSWERS, PHRASES, silence, speak

RATE = 24_000  # what Pipecat's realtime service sends and labels its output with
CHUNK_MS = 20  # one InputAudioRawFrame, as a transport delivers them
LEAD_MS = 1000.0
POLL_S = 0.05
ANSWER_TIMEOUT_S = 30.0  # generous: the cascade runs on CPU, shared with the test
TEST_TIMEOUT_S = 90.0

Script = Generator[Frame, None, None]
Wait = Generator[Frame, None, bool]


# -- what crossed the socket ---------------------------------------------------


@dataclass
class Wire:
    """Client and server events as JSON, in order, and the server events
    Pipecat's models refused (each one ends its receive loop)."""

    sent: list[dict[str, Any]] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)

    def sent_of(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.sent if e["type"] == event_type]

    def received_of(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.received if e["type"] == event_type]

    def summary(self) -> str:
        types = [e["type"] for e in self.received if not e["type"].endswith(".delta")]
        return f"server events (deltas left out): {types}"


@pytest.fixture
def wire(monkeypatch) -> Wire:
    """Keeps a copy of both directions; Pipecat's behaviour is unchanged."""
    log = Wire()
    parse = events.parse_server_event
    send = OpenAIRealtimeLLMService._ws_send

    def recording_parse(message):
        event = json.loads(message)
        log.received.append(event)
        try:
            return parse(message)
        except Exception as exc:
            log.refused.append((event.get("type", "?"), str(exc).split("\n\n")[0]))
            raise

    async def recording_send(self, realtime_message):
        log.sent.append(realtime_message)
        await send(self, realtime_message)

    monkeypatch.setattr(events, "parse_server_event", recording_parse)
    monkeypatch.setattr(OpenAIRealtimeLLMService, "_ws_send", recording_send)
    return log


# -- what crossed the pipeline ------------------------------------------------


class FrameTap(BaseObserver):
    """Every frame any processor originates, once, in order, with its origin."""

    def __init__(self) -> None:
        super().__init__(observe_every_push=False)
        self.pushed: list[tuple[FrameProcessor, FrameDirection, Frame]] = []

    async def on_push_frame(self, data: FramePushed) -> None:
        if not isinstance(data.frame, InputAudioRawFrame):
            self.pushed.append((data.source, data.direction, data.frame))

    def frames(self, kind: type | tuple[type, ...], source: FrameProcessor | None = None) -> list:
        return [
            frame
            for origin, _, frame in self.pushed
            if isinstance(frame, kind) and (source is None or origin is source)
        ]

    def index(self, frame: Frame) -> int:
        return next(i for i, (_, _, f) in enumerate(self.pushed) if f is frame)


@dataclass
class Conversation:
    llm: OpenAIRealtimeLLMService
    wire: Wire
    tap: FrameTap = field(default_factory=FrameTap)
    waited_for: str | None = None  # what a script gave up waiting for
    down: Sequence[Frame] = ()
    up: Sequence[Frame] = ()

    def of(self, kind: type | tuple[type, ...]) -> list:
        """Frames of ``kind`` the realtime service pushed (either direction)."""
        return self.tap.frames(kind, source=self.llm)

    def until(self, what: str, condition: Callable[[], object], timeout_s: float) -> Wait:
        """Poll ``condition`` while the pipeline runs; ``yield from`` gives
        whether it held before the timeout."""
        for _ in range(round(timeout_s / POLL_S)):
            if condition():
                return True
            yield SleepFrame(sleep=POLL_S)
        if condition():
            return True
        self.waited_for = what
        return False

    def transcript(self) -> str:
        return "".join(f.text for f in self.of(TTSTextFrame))

    def answers_audio(self) -> list[bytes]:
        """The audio of each answer, cut where Pipecat ended a response."""
        answers, current = [], b""
        for frame in self.of((TTSAudioRawFrame, LLMFullResponseEndFrame)):
            if isinstance(frame, LLMFullResponseEndFrame):
                answers.append(current)
                current = b""
            else:
                current += frame.audio
        return answers + ([current] if current else [])

    def responses_done(self) -> list[dict[str, Any]]:
        return [e["response"] for e in self.wire.received_of("response.done")]

    async def run(self, processor: FrameProcessor, script: Script) -> None:
        async with asyncio.timeout(TEST_TIMEOUT_S):
            self.down, self.up = await run_test(
                processor,
                frames_to_send=script,  # type: ignore[arg-type]  # iterated once, lazily
                observers=[self.tap],
                start_timeout=10.0,
            )
        assert not self.wire.refused, (
            f"Pipecat's event models refused {self.wire.refused}; {self.wire.summary()}"
        )
        errors = [f.error for f in self.tap.frames(ErrorFrame)]
        assert not errors, f"Pipecat reported errors {errors}; {self.wire.summary()}"
        assert self.waited_for is None, (
            f"timed out waiting for {self.waited_for}; {self.wire.summary()}"
        )


def realtime_service(
    server, session_properties: events.SessionProperties | None = None
) -> OpenAIRealtimeLLMService:
    """Pointed at the server the way a Pipecat user points it at any
    OpenAI-compatible endpoint: ``base_url`` (Pipecat appends ``?model=``)."""
    settings = OpenAIRealtimeLLMService.Settings(model="cascade")
    if session_properties is not None:  # else Pipecat's default SessionProperties()
        settings.session_properties = session_properties
    return OpenAIRealtimeLLMService(
        api_key="unused", base_url=f"ws://{server.base}/v1/realtime", settings=settings
    )


def paced(pcm: bytes) -> Script:
    """``pcm`` as 20 ms InputAudioRawFrames at the pace a microphone delivers them."""
    loop = asyncio.get_running_loop()
    step = RATE * CHUNK_MS // 1000 * 2
    next_at = loop.time()
    for at in range(0, len(pcm), step):
        yield InputAudioRawFrame(audio=pcm[at : at + step], sample_rate=RATE, num_channels=1)
        next_at += CHUNK_MS / 1000
        yield SleepFrame(sleep=max(0.0, next_at - loop.time()))


def heard(pcm: bytes) -> str:
    """What the recogniser hears in answer audio Pipecat labelled 24 kHz."""
    return Sphinx(ANSWERS).transcribe(resample_pcm16(pcm, RATE, 16_000))


# -- the tests ------------------------------------------------------------------


PROPOSALS = (ProposedUserStartedSpeakingFrame, ProposedUserStoppedSpeakingFrame)


def transcribing() -> events.SessionProperties:
    """Pipecat's defaults, with the user's words transcribed."""
    transcription = events.InputAudioTranscription()
    return events.SessionProperties(
        audio=events.AudioConfiguration(input=events.AudioInput(transcription=transcription))
    )


def server_vad() -> events.SessionProperties:
    """Turn detection as Pipecat's realtime examples configure it."""
    return events.SessionProperties(
        audio=events.AudioConfiguration(
            input=events.AudioInput(
                # Its transcription model name is OpenAI's ("gpt-realtime-whisper"):
                # accepted or ignored, never refused (an error ends Pipecat's session).
                transcription=events.InputAudioTranscription(),
                turn_detection=events.TurnDetection(silence_duration_ms=500),
            )
        )
    )


@pytest.mark.parametrize("explicit_vad", [False, True], ids=["pipecat_defaults", "server_vad"])
async def test_spoken_conversation(voice_server, wire, explicit_vad):
    """Two spoken turns; the server's VAD ends each one and answers it. With
    Pipecat's defaults the session.update says nothing about turn detection,
    so OpenAI's default, server VAD, must apply."""
    llm = realtime_service(voice_server, server_vad() if explicit_vad else None)
    conv = Conversation(llm, wire)
    phrases = [PHRASES[0], PHRASES[3]]

    def script() -> Script:
        yield from paced(silence(LEAD_MS))
        for turn, phrase in enumerate(phrases, start=1):
            yield from paced(speak(phrase, RATE) + silence(1200))
            answered = yield from conv.until(
                f"response.done of answer {turn} (LLMFullResponseEndFrame)",
                lambda turn=turn: len(conv.of(LLMFullResponseEndFrame)) >= turn,
                ANSWER_TIMEOUT_S,
            )
            if not answered:
                return
            yield from paced(silence(300))

    await conv.run(llm, script())

    # What Pipecat opened the session with.
    first_update = wire.sent_of("session.update")[0]["session"]
    if explicit_vad:
        assert first_update["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    else:
        assert "turn_detection" not in json.dumps(first_update)
    assert not wire.sent_of("input_audio_buffer.commit")  # the server ended the turns
    assert not wire.sent_of("response.create")  # ... and answered them by itself
    assert [r["status"] for r in conv.responses_done()] == ["completed", "completed"]

    # The server's VAD events became Pipecat's turn proposals (broadcast: one each way).
    proposals = [type(f) for f in conv.down if isinstance(f, PROPOSALS)]
    assert proposals == [ProposedUserStartedSpeakingFrame, ProposedUserStoppedSpeakingFrame] * 2
    # The user's words, as transcription frames (upstream: they left at the
    # source), where the session asked for transcription: OpenAI sends none
    # while input_audio_transcription is null, Pipecat's default.
    transcribed = [f.text for f in conv.up if isinstance(f, TranscriptionFrame)]
    assert transcribed == (phrases if explicit_vad else [])
    # The answers: 24 kHz mono audio frames saying them, and their transcript
    # as text frames.
    audio_frames = [f for f in conv.down if isinstance(f, TTSAudioRawFrame)]
    assert audio_frames and {(f.sample_rate, f.num_channels) for f in audio_frames} == {(RATE, 1)}
    assert conv.of(TTSStartedFrame) and conv.of(TTSStoppedFrame)
    answers = conv.answers_audio()
    assert [heard(pcm) for pcm in answers] == [f"you said {p}" for p in phrases]
    assert conv.transcript() == "".join(f"You said: {p}." for p in phrases)
    assert "".join(f.text for f in conv.of(LLMTextFrame)) == conv.transcript()


async def test_text_turn(voice_server, wire):
    """A typed user message in Pipecat's context, run the way Pipecat's
    realtime examples start a conversation (LLMRunFrame through the user
    aggregator): conversation.item.create, then response.create."""
    llm = realtime_service(voice_server)
    conv = Conversation(llm, wire)
    phrase = PHRASES[1]
    context = LLMContext([{"role": "user", "content": phrase}])
    user, assistant = LLMContextAggregatorPair(context)

    def script() -> Script:
        yield LLMRunFrame()
        yield from conv.until(
            "the answer's response.done (LLMFullResponseEndFrame)",
            lambda: conv.of(LLMFullResponseEndFrame),
            ANSWER_TIMEOUT_S,
        )

    await conv.run(Pipeline([user, llm, assistant]), script())

    (created,) = wire.sent_of("conversation.item.create")
    assert created["item"]["role"] == "user"
    assert created["item"]["content"] == [{"type": "input_text", "text": phrase}]
    (create,) = wire.sent_of("response.create")
    assert wire.sent.index(created) < wire.sent.index(create)
    assert [r["status"] for r in conv.responses_done()] == ["completed"]
    assert conv.transcript() == f"You said: {phrase}."
    assert [heard(pcm) for pcm in conv.answers_audio()] == [f"you said {phrase}"]
    # Pipecat's assistant aggregator wrote the answer into its context.
    assert context.get_messages()[-1] == {"role": "assistant", "content": conv.transcript()}


def realtime_turns() -> UserTurnProcessor:
    """What a Pipecat pipeline puts before a realtime service to turn the
    service's turn proposals (from speech_started / speech_stopped) into user
    turns and interruptions, set up the way ``realtime_service_mode`` sets up
    the user aggregator: a turn ends at speech_stopped, not at the transcript."""
    strategies = ExternalUserTurnStrategies()
    for stop in strategies.stop or []:
        stop.wait_for_transcript = False  # type: ignore[attr-defined]
    return UserTurnProcessor(user_turn_strategies=strategies)


async def test_speech_over_the_answer_interrupts_it(voice_server, wire):
    """Barge-in: the user talks while the answer is still coming. Pipecat turns
    the server's speech_started into its InterruptionFrame (and truncates the
    item it was playing); the server cancels the answer the OpenAI way
    (response.done cancelled, reason turn_detected, no more of its audio after
    the speech_started); the new utterance gets its own answer."""
    llm = realtime_service(voice_server, transcribing())
    conv = Conversation(llm, wire)
    turns = realtime_turns()
    first, second = PHRASES[0], PHRASES[2]

    def answered() -> bool:
        done = conv.responses_done()
        return len(done) >= 2 and done[-1]["status"] == "completed"

    def script() -> Script:
        yield from paced(silence(LEAD_MS) + speak(first, RATE) + silence(800))
        answering = yield from conv.until(
            "the first answer's audio, the user's turn over",
            lambda: conv.of(TTSAudioRawFrame) and conv.tap.frames(UserStoppedSpeakingFrame),
            ANSWER_TIMEOUT_S,
        )
        if not answering:
            return
        # Talk over it: the answer is about 2 s of audio, which the server
        # sends at playback pace.
        yield from paced(speak(second, RATE) + silence(1200))
        yield from conv.until("the answer to the second utterance", answered, ANSWER_TIMEOUT_S)

    await conv.run(Pipeline([turns, llm]), script())

    done = conv.responses_done()
    assert [r["status"] for r in done] == ["cancelled", "completed"], done
    cancelled = done[0]
    assert (cancelled.get("status_details") or {}).get("reason") == "turn_detected", cancelled

    # The speech that interrupted it came while it was still being sent ...
    received = wire.received
    barge = next(
        (
            i
            for i, e in enumerate(received)
            if e["type"] == "input_audio_buffer.speech_started"
            and any(
                d["type"] == "response.output_audio.delta" and d["response_id"] == cancelled["id"]
                for d in received[:i]
            )
        ),
        None,
    )
    assert barge is not None, f"no speech_started during the first answer; {wire.summary()}"
    assert barge < received.index(wire.received_of("response.done")[0])
    # ... and OpenAI's server VAD (interrupt_response) stops the answer at the
    # speech start: none of its audio after the speech_started that Pipecat
    # acted on (it stopped playing there and truncated the item).
    late = [
        e
        for e in received[barge:]
        if e["type"] == "response.output_audio.delta" and e["response_id"] == cancelled["id"]
    ]
    assert not late, f"{len(late)} audio deltas of the cancelled answer after speech_started"
    (truncate,) = wire.sent_of("conversation.item.truncate")
    assert truncate["item_id"] == cancelled["output"][0]["id"]
    assert wire.received_of("conversation.item.truncated")

    # Pipecat interrupted its own output once the first answer had started.
    first_audio = conv.tap.index(conv.of(TTSAudioRawFrame)[0])
    interruptions = [
        f for f in conv.tap.frames(InterruptionFrame) if conv.tap.index(f) > first_audio
    ]
    assert interruptions, "no InterruptionFrame after the first answer started"

    transcriptions = [f.text for f in conv.up if isinstance(f, TranscriptionFrame)]
    assert transcriptions == [first, second]
    assert conv.transcript().endswith(f"You said: {second}.")
    assert wire.received_of("response.output_audio_transcript.done")[-1]["transcript"] == (
        f"You said: {second}."
    )
