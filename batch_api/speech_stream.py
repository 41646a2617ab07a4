"""``WS /v1/audio/speech/stream``: text arrives in fragments, speech leaves
sentence by sentence (protocol/speech_stream.py has the messages).

A voice agent's text comes a token at a time; speaking it only at the end
would add the whole answer's synthesis to the first audio. Each complete
piece (text_split.py) is synthesised by the server's TTS stage through
:class:`BatchSpeech`, behind realtime sessions (batch priority), and sent
while the client keeps typing. :class:`SpeechStream` decides what each client event means (no
socket in it); :func:`speech_stream_endpoint` moves frames and time.

Bounds: text buffered and not yet spoken per socket (``MAX_UNSPOKEN_CHARS``,
past it ``payload_too_large``), client frames a second (past it
``rate_limited`` and reading pauses), a frame's size
(``MAX_CLIENT_FRAME_BYTES``), sockets per client address (shared with
``/v1/realtime``)."""

from __future__ import annotations

import asyncio
import io
import logging
import wave
from collections import Counter
from dataclasses import dataclass

from starlette.websockets import WebSocket, WebSocketDisconnect

from batch_api.text_split import TextSplitter
from duplex_server import metrics
from duplex_server.audio import resample_pcm16
from duplex_server.auth import caller, denial
from duplex_server.http_errors import protocol_refusal, refusal
from duplex_server.models.batch_audio import BatchSpeech
from duplex_server.transport import ConnectionRate
from protocol.close_codes import CloseCode
from protocol.errors import ProtocolError, error_body
from protocol.speech_stream import (
    AudioDone,
    AudioStart,
    InputDone,
    InputText,
    SessionClose,
    SessionConfig,
    SessionDone,
    SpeechStreamServerEvent,
    StreamError,
    UtteranceDone,
    decode_speech_stream_event,
    encode_speech_stream_event,
)

log = logging.getLogger(__name__)

MAX_UNSPOKEN_CHARS = 16_384
FRAMES_PER_S = 50.0  # client frames; two seconds' burst
FRAME_MS = 100  # audio per binary frame
FORMATS = ("pcm", "wav")
MIN_RATE_HZ, MAX_RATE_HZ = 8_000, 48_000
ROUTE = "/v1/audio/speech/stream"


@dataclass(frozen=True)
class Piece:
    utterance: int
    sentence: int
    text: str
    voice: str
    config: SessionConfig


@dataclass(frozen=True)
class UtteranceEnd:
    utterance: int
    sentences: int


Work = Piece | UtteranceEnd


class SpeechStream:
    """One socket's text state: its config, the open utterance's splitter
    and counters. Each method returns the work it makes or raises the
    ProtocolError the client gets; nothing here touches the socket."""

    def __init__(self, speech: BatchSpeech) -> None:
        self._speech = speech
        self.config = SessionConfig()
        self._voice = self._check(self.config)
        self._splitter = TextSplitter(self.config.split_granularity)
        self.utterance = 0
        self._sentence = 0  # pieces of the open utterance so far
        self.total_sentences = 0
        self.queued_chars = 0  # in pieces made, not yet spoken

    @property
    def utterance_open(self) -> bool:
        """Text has arrived since the last ``input.done``."""
        return self._sentence > 0 or bool(self._splitter.pending)

    def configure(self, config: SessionConfig) -> None:
        if self.utterance_open:
            raise ProtocolError(
                "config_update_mid_utterance",
                "session.config is refused while an utterance is open: send input.done first",
                param="type",
            )
        self._voice = self._check(config)
        self.config = config
        self._splitter = TextSplitter(config.split_granularity)

    def _check(self, config: SessionConfig) -> str:
        speech = self._speech
        if config.model is not None and config.model not in speech.models:
            raise ProtocolError(
                "invalid_value",
                f"model {config.model!r} is not served; one of {sorted(speech.models)}",
                param="model",
            )
        if config.response_format not in FORMATS:
            raise ProtocolError(
                "invalid_value",
                f"response_format {config.response_format!r}: the stream sends pcm or wav",
                param="response_format",
            )
        if not speech.speed.low <= config.speed <= speech.speed.high:
            raise ProtocolError(
                "invalid_value",
                f"{speech.name} speaks at speed {speech.speed.low} to {speech.speed.high}",
                param="speed",
            )
        if not MIN_RATE_HZ <= config.sample_rate <= MAX_RATE_HZ:
            raise ProtocolError(
                "invalid_value",
                f"sample_rate is {MIN_RATE_HZ} to {MAX_RATE_HZ} Hz",
                param="sample_rate",
            )
        voice = speech.voice(config.voice or "default")
        if voice is None:
            raise ProtocolError("invalid_value", f"unknown voice {config.voice!r}", param="voice")
        return voice

    def text(self, text: str) -> list[Work]:
        unspoken = len(self._splitter.pending) + self.queued_chars
        if unspoken + len(text) > MAX_UNSPOKEN_CHARS:
            raise ProtocolError(
                "payload_too_large",
                f"at most {MAX_UNSPOKEN_CHARS} characters wait to be spoken; "
                f"{unspoken} do now: send this text again once audio has caught up",
                param="text",
            )
        return self._pieces(self._splitter.push(text))

    def done(self) -> list[Work]:
        work = self._pieces(self._splitter.flush())
        work.append(UtteranceEnd(self.utterance, self._sentence))
        self.utterance += 1
        self._sentence = 0
        return work

    def spoken(self, piece: Piece) -> None:
        self.queued_chars -= len(piece.text)

    def _pieces(self, texts: list[str]) -> list[Work]:
        pieces: list[Work] = []
        for text in texts:
            pieces.append(Piece(self.utterance, self._sentence, text, self._voice, self.config))
            self._sentence += 1
            self.total_sentences += 1
            self.queued_chars += len(text)
        return pieces


def wav_bytes(pcm: bytes, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(pcm)
    return out.getvalue()


class _Gone(Exception):
    """The client's socket closed under a send."""


class SpeechStreamConnection:
    """The socket shell: reads frames into :class:`SpeechStream`, speaks its
    pieces in order on one task, sends each sentence's messages together."""

    def __init__(self, websocket: WebSocket, speech: BatchSpeech) -> None:
        self.websocket = websocket
        self.speech = speech
        self.stream = SpeechStream(speech)
        self._work: asyncio.Queue[Work | None] = asyncio.Queue()  # None: close
        self._send_lock = asyncio.Lock()
        self._rate = ConnectionRate(FRAMES_PER_S)

    async def run(self) -> None:
        speaking = asyncio.create_task(self._speak_all())
        try:
            closing = await self._read_all()
            if closing:
                self._work.put_nowait(None)
                await speaking
                await self._send(
                    SessionDone(
                        utterances=self.stream.utterance,
                        total_sentences=self.stream.total_sentences,
                    )
                )
                await self.websocket.close(CloseCode.NORMAL, "session.close")
        except (_Gone, WebSocketDisconnect):
            pass
        finally:
            speaking.cancel()
            # Its end (cancelled, or the socket gone under a send) is this one's.
            await asyncio.gather(speaking, return_exceptions=True)

    async def _read_all(self) -> bool:
        """Frames until ``session.close`` (True) or the client goes (False)."""
        loop = asyncio.get_running_loop()
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return False
            if not self._rate.admit("socket", loop.time()):
                await self._refuse(ProtocolError("rate_limited", "too many frames; slow down"))
                await asyncio.sleep(1 / FRAMES_PER_S)
                continue
            frame = message.get("text")
            if frame is None:
                await self._refuse(
                    ProtocolError("invalid_event", "frames are JSON text; audio only flows out")
                )
                continue
            try:
                if self._apply(frame):
                    return True
            except ProtocolError as err:
                await self._refuse(err)

    def _apply(self, frame: str) -> bool:
        event = decode_speech_stream_event(frame)
        if isinstance(event, SessionConfig):
            self.stream.configure(event)
        elif isinstance(event, InputText):
            self._queue(self.stream.text(event.text))
        elif isinstance(event, InputDone):
            self._queue(self.stream.done())
        elif isinstance(event, SessionClose):
            if self.stream.utterance_open:  # what was typed is spoken, not dropped
                self._queue(self.stream.done())
            return True
        return False

    def _queue(self, work: list[Work]) -> None:
        for item in work:
            self._work.put_nowait(item)

    async def _speak_all(self) -> None:
        while (item := await self._work.get()) is not None:
            if isinstance(item, UtteranceEnd):
                await self._send(UtteranceDone(item.utterance, item.sentences))
                continue
            try:
                await self._speak(item)
            finally:
                self.stream.spoken(item)

    async def _speak(self, piece: Piece) -> None:
        config = piece.config
        try:
            clauses = self.speech.synthesize(piece.text, piece.voice, config.speed)
            pcm = b"".join([chunk async for chunk in clauses])
        except (OSError, RuntimeError, ValueError) as exc:  # the synthesiser failed
            log.exception("speech stream synthesis failed")
            await self._refuse(ProtocolError("engine_error", f"synthesis failed: {exc}"))
            return
        pcm = resample_pcm16(pcm, self.speech.sample_rate_hz, config.sample_rate)
        audio = wav_bytes(pcm, config.sample_rate) if config.response_format == "wav" else pcm
        step = config.sample_rate * FRAME_MS // 1000 * 2
        start = AudioStart(
            utterance_index=piece.utterance,
            sentence_index=piece.sentence,
            sentence_text=piece.text,
            format="wav" if config.response_format == "wav" else "pcm",
            sample_rate=config.sample_rate,
        )
        done = AudioDone(
            utterance_index=piece.utterance,
            sentence_index=piece.sentence,
            audio_bytes=len(audio),
            duration_ms=len(pcm) * 1000 // (2 * config.sample_rate),
        )
        async with self._send_lock:  # one sentence's messages are not interleaved
            await self._send_now(encode_speech_stream_event(start))
            for at in range(0, len(audio), step):
                await self._send_now(audio[at : at + step])
            await self._send_now(encode_speech_stream_event(done))

    async def _refuse(self, err: ProtocolError) -> None:
        err.forget_traceback()
        await self._send(StreamError(error=error_body(err)))

    async def _send(self, event: SpeechStreamServerEvent) -> None:
        async with self._send_lock:
            await self._send_now(encode_speech_stream_event(event))

    async def _send_now(self, payload: str | bytes) -> None:
        try:
            if isinstance(payload, bytes):
                await self.websocket.send_bytes(payload)
            else:
                await self.websocket.send_text(payload)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise _Gone() from exc


async def speech_stream_endpoint(websocket: WebSocket) -> None:
    """Refused before the upgrade: a wrong key (401), a key without the
    ``batch`` scope (403), a model with no synthesiser (404); a page from an
    origin not allowed and an address over its socket cap are closed."""
    app_state = websocket.app.state
    refused = denial(caller(websocket), "batch")
    speech: BatchSpeech | None = app_state.batch.audio.speech
    if refused is not None:
        status, err = refused
        metrics.ADMISSIONS_REFUSED.labels(err.code).inc()
        await websocket.send_denial_response(protocol_refusal(status, err))
        return
    if speech is None:  # as the batch speech route answers it
        model = app_state.config.model
        message = (
            f"this server runs --model {model}, which has no synthesiser (serve --model cascade)"
        )
        await websocket.send_denial_response(
            refusal(404, "model_not_loaded", message, param="model")
        )
        return
    allowed = app_state.config.allowed_origins
    origin = websocket.headers.get("origin")
    if allowed and origin is not None and origin not in allowed:
        await websocket.close(CloseCode.POLICY_VIOLATION, "origin not allowed")
        return
    address = websocket.client.host if websocket.client else ""
    sockets: Counter[str] = app_state.sockets_per_address
    cap = app_state.config.max_connections_per_ip
    if cap and sockets[address] >= cap:
        await websocket.close(CloseCode.TRY_AGAIN_LATER, "too many connections from this address")
        return
    sockets[address] += 1
    try:
        await websocket.accept()
        await SpeechStreamConnection(websocket, speech).run()
    finally:
        sockets[address] -= 1
        if not sockets[address]:
            del sockets[address]
