"""The turn's final transcript starts at the pause after the speech, while
the VAD still waits out its silence, and the turn uses it when the speech
did not resume: driven the way the actor drives Hearing, with a recogniser
that notes each call and a VAD that hears tone as speech."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

from duplex_server.sessions.core.heard import TurnEnded
from duplex_server.sessions.core.model_port import NO_HINTS, TranscriptionHints
from duplex_server.sessions.core.records import AudioBody, CommitBody
from duplex_server.sessions.runtime.hearing import SPECULATE_AFTER_MS, Hearing
from protocol import client_events as ce
from protocol.session_config import TurnDetection
from tests.test_heard import MODEL, Session
from tests.wsclient import b64, tone_pcm16

CHUNK_MS = 20
RATE = 24_000


class ToneScorer:
    """One 20 ms window per chunk: speech where the chunk has any sound."""

    window_ms = CHUNK_MS

    def __init__(self) -> None:
        self.heard_ms = 0.0

    async def score(self, pcm16: bytes, sample_rate_hz: int) -> list[tuple[float, float]]:
        self.heard_ms += len(pcm16) / 2 / sample_rate_hz * 1000
        return [(self.heard_ms, 0.9 if any(pcm16) else 0.1)]


@dataclass
class NotingRecogniser:
    transcription_languages: frozenset[str] | None = None
    transcription_prompts: bool = True
    finals: list[int] = field(default_factory=list)  # audio bytes of each final call

    def open_scorer(self) -> ToneScorer:
        return ToneScorer()

    def can_take_partial(self) -> bool:
        return False  # this test is about finals

    async def transcribe(
        self,
        pcm16: bytes,
        sample_rate_hz: int,
        partial: bool = False,
        hints: TranscriptionHints = NO_HINTS,
    ) -> str:
        self.finals.append(len(pcm16))
        await asyncio.sleep(0)
        return f"heard {len(pcm16)} bytes"


class Driver:
    """Appends 20 ms chunks and does what the actor does after each one."""

    def __init__(self) -> None:
        self.ears = NotingRecogniser()
        model = SimpleNamespace(listening=self.ears, capabilities=MODEL.capabilities)
        self.session = Session()
        self.session.state.config.turn_detection = TurnDetection(
            type="server_vad",
            threshold=0.5,
            prefix_padding_ms=300,
            silence_duration_ms=500,
            create_response=True,
            interrupt_response=True,
        )
        self.hearing = Hearing(model, lambda message: None)  # type: ignore[arg-type]
        self.finals_at_stop: int | None = None

    async def chunks(self, ms: float, speech: bool) -> None:
        for _ in range(int(ms // CHUNK_MS)):
            pcm = tone_pcm16(CHUNK_MS) if speech else b"\0\0" * (RATE * CHUNK_MS // 1000)
            self.session.run(ce.InputAudioAppend(audio=b64(pcm)))
            audio = next(
                r.body for r in reversed(self.session.log) if isinstance(r.body, AudioBody)
            )
            for transition in await self.hearing.hear(self.session.state, audio):
                command = self.hearing.decide(self.session.state, transition)
                if command is None:
                    continue
                heard = None
                if isinstance(command, TurnEnded):
                    self.finals_at_stop = len(self.ears.finals)
                    # What the actor's input preparation does before the step.
                    heard = await self.hearing.transcribe(self.session.state, command.at_ms)
                self.session.run(command, heard)
            self.hearing.after_audio(self.session.state)
            await asyncio.sleep(0)

    def commits(self) -> list[CommitBody]:
        return [r.body for r in self.session.log if isinstance(r.body, CommitBody)]


async def test_the_final_transcript_starts_at_the_pause_and_serves_the_turn():
    driver = Driver()
    await driver.chunks(300, speech=False)
    await driver.chunks(600, speech=True)
    await driver.chunks(800, speech=False)  # silence_duration_ms is 500
    (commit,) = driver.commits()
    # One final decode, started before the VAD ended the turn, and it is the turn's.
    assert driver.finals_at_stop == 1
    assert len(driver.ears.finals) == 1
    assert commit.transcript == f"heard {driver.ears.finals[0]} bytes"
    # It covered the speech and the pause that started it, not the whole hangover.
    speech_and_pause_ms = 600 + SPECULATE_AFTER_MS
    assert driver.ears.finals[0] < (300 + speech_and_pause_ms + 300) * RATE // 1000 * 2
    assert commit.stage_ms["vad_hangover_ms"] >= 500
    assert commit.stage_ms["asr_final_ms"] >= 0


async def test_speech_that_resumes_after_a_pause_gets_a_final_of_all_of_it():
    driver = Driver()
    await driver.chunks(600, speech=True)
    await driver.chunks(300, speech=False)  # a pause: a final starts, the speech goes on
    await driver.chunks(600, speech=True)
    await driver.chunks(800, speech=False)
    (commit,) = driver.commits()
    first, second = driver.ears.finals
    assert second > first
    assert commit.transcript == f"heard {second} bytes"


async def test_a_pause_shorter_than_the_speculation_starts_nothing():
    driver = Driver()
    await driver.chunks(600, speech=True)
    await driver.chunks(SPECULATE_AFTER_MS - 2 * CHUNK_MS, speech=False)
    await driver.chunks(200, speech=True)
    assert driver.ears.finals == []
