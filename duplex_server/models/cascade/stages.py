"""The cascade's audio stages, loaded once: what the session core calls
through :class:`~duplex_server.sessions.model_port.Listening`, and the
synthesiser its responses use."""

from __future__ import annotations

from duplex_server.audio import resample_pcm16
from duplex_server.engine.audio.espeak import Espeak
from duplex_server.engine.audio.silero import SAMPLE_RATE_HZ as VAD_RATE_HZ
from duplex_server.engine.audio.silero import WINDOW_MS, SileroModel, VadStream
from duplex_server.engine.audio.sphinx import SAMPLE_RATE_HZ as ASR_RATE_HZ
from duplex_server.engine.audio.sphinx import Sphinx
from duplex_server.engine.audio.worker import StageWorker


class SileroScorer:
    """One session's VAD stream; scoring runs on the shared VAD thread."""

    window_ms = WINDOW_MS

    def __init__(self, model: SileroModel, worker: StageWorker) -> None:
        self._stream = VadStream(model)
        self._worker = worker

    async def score(self, pcm16: bytes, sample_rate_hz: int) -> list[tuple[float, float]]:
        audio = resample_pcm16(pcm16, sample_rate_hz, VAD_RATE_HZ)
        return await self._worker.run(self._stream.feed, audio)


class CascadeStages:
    def __init__(self, phrases: list[str] | None = None) -> None:
        self.vad_model = SileroModel()
        self.asr = Sphinx(phrases)
        self.tts = Espeak.shared()
        self.vad_worker = StageWorker("vad")
        self.asr_worker = StageWorker("asr")
        self.tts_worker = StageWorker("tts")

    # --- Listening -----------------------------------------------------------

    def open_scorer(self) -> SileroScorer:
        return SileroScorer(self.vad_model, self.vad_worker)

    async def transcribe(self, pcm16: bytes, sample_rate_hz: int) -> str:
        audio = resample_pcm16(pcm16, sample_rate_hz, ASR_RATE_HZ)
        return await self.asr_worker.run(self.asr.transcribe, audio)

    # --- speaking --------------------------------------------------------------

    async def synthesize(self, text: str, voice: str, speed: float) -> tuple[bytes, int]:
        pcm = await self.tts_worker.run(self.tts.synthesize, text, voice, speed)
        return pcm, self.tts.sample_rate_hz
