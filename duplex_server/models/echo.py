"""The ``echo`` loopback model: answers each user turn with its own audio.

It exists so every surface of the protocol can be exercised and measured
without a model: it advertises full capabilities (barge-in, resume,
truncation) and streams the committed audio back through the engine core in
``chunk_period_ms`` slices, one transcript delta per audio delta.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec

from duplex_server.audio import resample_pcm16
from duplex_server.engine import EngineCore, EngineRequest
from duplex_server.models.capabilities import built_in
from duplex_server.models.engine_requests import for_response
from duplex_server.sessions.core.model_port import (
    HistoryItem,
    ModelChunk,
    ResponseRequest,
    SessionView,
)
from protocol.capabilities import CLIENT_EVENT

MODEL_RATE_HZ = 24_000
CHUNK_PERIOD_MS = 100


class EchoPayload(msgspec.Struct):
    pcm: bytes
    sample_rate_hz: int
    text: str
    chunk_delay_ms: float
    text_only: bool


def _last_user_item(history: list[HistoryItem]) -> HistoryItem | None:
    for item in reversed(history):
        if item.role == "user":
            return item
    return None


def _split_words(text: str, pieces: int) -> list[str]:
    """Spread ``text`` over ``pieces`` deltas; concatenated they give back ``text``."""
    words = text.split(" ") if text else []
    out: list[str] = []
    for index in range(pieces):
        lo = len(words) * index // pieces
        hi = len(words) * (index + 1) // pieces
        chunk = " ".join(words[lo:hi])
        if chunk and out and any(out):
            chunk = " " + chunk
        out.append(chunk)
    return out


class EchoBackend:
    """Engine backend: slices audio into chunk-period pieces."""

    async def generate(self, request: EngineRequest[EchoPayload]) -> AsyncIterator[ModelChunk]:
        payload = request.payload
        if payload.text_only:
            for word in _split_words(payload.text, max(1, len(payload.text.split()))):
                yield ModelChunk(text=word)
                await self._pause(payload.chunk_delay_ms)
            return
        pcm = resample_pcm16(payload.pcm, payload.sample_rate_hz, MODEL_RATE_HZ)
        step = MODEL_RATE_HZ * CHUNK_PERIOD_MS // 1000 * 2
        count = max(1, -(-len(pcm) // step))
        texts = _split_words(payload.text, count)
        for index in range(count):
            yield ModelChunk(
                audio=pcm[index * step : (index + 1) * step],
                sample_rate_hz=MODEL_RATE_HZ,
                text=texts[index],
            )
            await self._pause(payload.chunk_delay_ms)

    @staticmethod
    async def _pause(delay_ms: float) -> None:
        # Always yield to the loop so many sessions interleave fairly.
        await asyncio.sleep(delay_ms / 1000.0)


class EchoModel:
    name = "echo"
    turn_detection_types: tuple[str, ...] = ()
    listening = None  # it repeats audio; it does not hear
    streaming = None  # turn-based: it answers commits
    loaded = True  # nothing to load

    @property
    def answering(self) -> EchoModel:
        return self

    # Its turns end by the client's commit (it has no VAD); it answers a turn
    # with audio by repeating it, and a text-only turn with its text.
    capabilities = built_in(
        "loopback",
        CHUNK_PERIOD_MS,
        signal_sources=[CLIENT_EVENT],
        native_turn_policy=False,
        required_input_modalities=[],
        optional_input_modalities=["audio", "text"],
        text_only_turn=True,
    )

    def __init__(self, engine: EngineCore[EchoPayload, ModelChunk]) -> None:
        self.engine = engine

    def wants_to_speak(self, history: list[HistoryItem], config: SessionView) -> bool:
        item = _last_user_item(history)
        return item is not None and bool(item.audio_ms or item.text)

    def accepts_voice(self, voice: str) -> bool:
        """It speaks with the user's own voice: any name is as good as another."""
        return True

    def instructions_refusal(self, instructions: str) -> str | None:
        return None  # read as text, any length the session takes

    def stream(self, request: ResponseRequest) -> AsyncIterator[ModelChunk]:
        item = _last_user_item(request.history)
        pcm = request.audio.get(item.id, b"") if item else b""
        has_audio = item is not None and bool(pcm) and item.audio_ms > 0
        payload = EchoPayload(
            pcm=pcm,
            sample_rate_hz=item.audio_rate if item is not None and has_audio else MODEL_RATE_HZ,
            text=item.text if item else "",
            chunk_delay_ms=request.config.chunk_delay_ms,
            text_only="audio" not in request.modalities or not has_audio,
        )
        return self.engine.submit(for_response(request, payload))

    def abort(self, response_id: str) -> None:
        self.engine.abort(response_id)
