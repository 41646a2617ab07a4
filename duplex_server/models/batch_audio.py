"""The server's speech stages as batch jobs use them (``/v1/audio/speech``,
``/v1/audio/transcriptions``).

Batch work goes through the same engine workers as live sessions' speech,
at :attr:`Priority.BATCH`, so a live session's request waiting for the
stage goes first. Speech is synthesised clause by clause, one engine request
each, so a long batch text holds the synthesiser for one clause at a time,
never for the whole text. Transcription is heard a stretch between pauses
at a time, each stretch one engine request, so a streamed transcription
tells each stretch's words as soon as they are heard.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from duplex_server import metrics
from duplex_server.audio import resample_pcm16
from duplex_server.audio.pauses import speech_stretches
from duplex_server.engine import Priority
from duplex_server.sessions.core.model_port import ModelPort

if TYPE_CHECKING:
    from duplex_server.models.cascade.stages import CascadeStages, SeededSynthesiser

# What OpenAI's clients send, served by whatever synthesiser / recogniser
# this server runs (besides each one's own name).
SPEECH_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
TRANSCRIPTION_MODEL_ALIASES = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
MAX_CLAUSE_CHARS = 400
SEGMENT_MARGIN_S = 0.3  # a clause longer than this is cut at a space


@dataclass(frozen=True)
class SpeedRange:
    low: float
    high: float


class BatchSpeech:
    def __init__(
        self,
        stages: CascadeStages,
        voices: dict[str, str],
        clauses: Callable[[str], list[str]],
    ) -> None:
        self._stages = stages
        self._voices = voices
        self._clauses = clauses
        tts = stages.tts
        self.name = type(tts).__name__.lower()
        self.sample_rate_hz: int = tts.sample_rate_hz
        self.models = frozenset({self.name, *SPEECH_MODEL_ALIASES})
        self.speed = _speed_range(tts)
        self._seeded = _seeded(tts)
        # Whether a seed pins the synthesiser's output (a sampling one: VITS).
        self.seedable = self._seeded is not None
        self.runs = 0  # engine requests batch speech made (clauses synthesised)

    def voice(self, name: str) -> str | None:
        """The synthesiser's voice for an OpenAI name or its own; None if unknown."""
        voice = self._voices.get(name, name)
        return voice if self._stages.tts.knows_voice(voice) else None

    async def synthesize(
        self, text: str, voice: str, speed: float, seed: int | None = None
    ) -> AsyncIterator[bytes]:
        """pcm16 at :attr:`sample_rate_hz`, a clause at a time. ``seed``
        (only where :attr:`seedable`) pins the sampler: each clause draws
        from its own seed, derived from ``seed`` and its place in the text,
        so the whole text comes out the same however the clauses interleave
        with other work."""
        stage = self._stages.tts_stage
        tts = self._stages.tts
        for index, clause in enumerate(split_long(self._clauses(text), MAX_CLAUSE_CHARS)):
            started = time.perf_counter()
            if seed is None:
                pcm = await stage.run(tts.synthesize, clause, voice, speed, priority=Priority.BATCH)
            else:
                assert self._seeded is not None  # the route refuses a seed otherwise
                pcm = await stage.run(
                    self._seeded.synthesize_seeded,
                    clause,
                    voice,
                    speed,
                    clause_seed(seed, index),
                    priority=Priority.BATCH,
                )
            self.runs += 1
            metrics.observe_stage(
                "tts_batch", time.perf_counter() - started, len(pcm) / 2 / self.sample_rate_hz
            )
            yield pcm


@runtime_checkable
class WordTimer(Protocol):
    """A recogniser that says when each word it heard was said (Whisper on
    CTranslate2: its own alignment). PocketSphinx here does not: its worker
    process answers text only, so word times are refused, never guessed."""

    def transcribe_timed(
        self, pcm16: bytes, language: str | None, prompt: str | None
    ) -> tuple[str, list[tuple[str, float, float]]]: ...


class BatchTranscriber:
    def __init__(self, stages: CascadeStages, asr_rate_hz: int) -> None:
        self._stages = stages
        self._rate = asr_rate_hz
        asr = stages.asr
        self.name: str = asr.name.split(":")[0]
        self.models = frozenset({self.name, *TRANSCRIPTION_MODEL_ALIASES})
        self.languages: frozenset[str] | None = asr.languages
        self.takes_prompt: bool = asr.takes_prompt
        self.word_times = isinstance(asr, WordTimer)
        self.sample_rate_hz = asr_rate_hz
        self.runs = 0  # engine requests batch transcription made (stretches heard)

    async def transcribe(
        self, pcm16: bytes, sample_rate_hz: int, language: str | None, prompt: str | None
    ) -> str:
        text, _ = await self._hear(pcm16, sample_rate_hz, language, prompt, timed=False)
        return text

    async def _hear(
        self,
        pcm16: bytes,
        sample_rate_hz: int,
        language: str | None,
        prompt: str | None,
        timed: bool,
    ) -> tuple[str, list[tuple[str, float, float]]]:
        audio = resample_pcm16(pcm16, sample_rate_hz, self._rate)
        started = time.perf_counter()
        stage = self._stages.asr_stage
        asr = self._stages.asr
        if timed:
            assert isinstance(asr, WordTimer)  # the route refuses word times otherwise
            heard: tuple[str, list[tuple[str, float, float]]] = await stage.run(
                asr.transcribe_timed, audio, language, prompt, priority=Priority.BATCH
            )
        else:
            text: str = await stage.run(
                asr.transcribe, audio, language, prompt, priority=Priority.BATCH
            )
            heard = (text, [])
        self.runs += 1
        metrics.observe_stage(
            "asr_batch", time.perf_counter() - started, len(audio) / 2 / self._rate
        )
        return heard

    async def segments(
        self,
        pcm16: bytes,
        sample_rate_hz: int,
        language: str | None,
        prompt: str | None,
        words: bool = False,
    ) -> list[Segment]:
        return [s async for s in self.heard(pcm16, sample_rate_hz, language, prompt, words)]

    async def heard(
        self,
        pcm16: bytes,
        sample_rate_hz: int,
        language: str | None,
        prompt: str | None,
        words: bool = False,
    ) -> AsyncIterator[Segment]:
        """The recording cut at its pauses, each stretch one engine request,
        yielded as it is heard: its words with where it starts and ends (a
        live session's turn waits for one stretch at most). ``words`` (a
        :class:`WordTimer` only): each word's times too, the recogniser's
        own, moved from the framed stretch onto the recording and kept
        inside the stretch."""
        for start, end in speech_stretches(pcm16, sample_rate_hz):
            piece = pcm16[int(start * sample_rate_hz) * 2 : int(end * sample_rate_hz) * 2]
            # Framed in silence, as a turn reaches the recogniser: Whisper
            # repeats itself on speech cut off right at its last word.
            margin = int(SEGMENT_MARGIN_S * sample_rate_hz)
            quiet = b"\0\0" * margin
            text, timed = await self._hear(
                quiet + piece + quiet, sample_rate_hz, language, prompt, words
            )
            text = text.strip()
            if not text:
                continue
            shift = start - margin / sample_rate_hz
            spoken = tuple(
                Word(word, _within(shift + s, start, end), _within(shift + e, start, end))
                for word, s, e in timed
            )
            yield Segment(start, end, text, spoken)


def _within(seconds: float, low: float, high: float) -> float:
    return min(max(seconds, low), high)


@dataclass(frozen=True)
class Word:
    word: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Segment:
    start_s: float
    end_s: float
    text: str
    words: tuple[Word, ...] = ()


@dataclass(frozen=True)
class BatchAudio:
    """None where the server's model has no such stage (``--model echo``)."""

    speech: BatchSpeech | None
    transcriber: BatchTranscriber | None
    model_name: str


def batch_audio(model: ModelPort) -> BatchAudio:
    if model.name != "cascade":
        return BatchAudio(None, None, model.name)
    # Imported here: the cascade's stages load onnxruntime, eSpeak and the recognisers.
    from duplex_server.engine.audio.sphinx import SAMPLE_RATE_HZ
    from duplex_server.models.cascade.model import VOICES, CascadeModel, clauses

    assert isinstance(model, CascadeModel)
    stages = model.listening
    return BatchAudio(
        BatchSpeech(stages, VOICES, clauses), BatchTranscriber(stages, SAMPLE_RATE_HZ), model.name
    )


def split_long(pieces: list[str], limit: int) -> list[str]:
    """Each piece at most ``limit`` characters, cut at a space where one is near."""
    out: list[str] = []
    for piece in pieces:
        while len(piece) > limit:
            cut = piece.rfind(" ", limit // 2, limit)
            cut = cut if cut > 0 else limit
            out.append(piece[:cut])
            piece = piece[cut:].lstrip()
        if piece.strip():
            out.append(piece)
    return out


def clause_seed(seed: int, index: int) -> int:
    """Clause ``index``'s seed: 63 bits of SHA-256 over the request's seed and the index."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _seeded(tts: object) -> SeededSynthesiser | None:
    from duplex_server.models.cascade.stages import SeededSynthesiser

    return tts if isinstance(tts, SeededSynthesiser) else None


def _speed_range(tts: object) -> SpeedRange:
    from duplex_server.engine.audio.espeak import DEFAULT_WPM, MAX_WPM, MIN_WPM, Espeak

    if isinstance(tts, Espeak):
        return SpeedRange(round(MIN_WPM / DEFAULT_WPM, 2), round(MAX_WPM / DEFAULT_WPM, 2))
    return SpeedRange(0.25, 4.0)
