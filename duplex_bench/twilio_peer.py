"""A simulated Twilio: a call's media stream as Twilio's documentation tells it
(the tests' carrier and the telephony bench's callers).

``TwilioPeer`` opens the stream socket with a signed upgrade, sends
``connected`` and ``start`` (the voice webhook's parameters echoed), then the
caller's audio as 20 ms mu-law ``media`` frames at real-time pace, and
plays what the server sends as a phone would: outbound ``media`` queues
behind what is playing, a ``mark`` is echoed once the audio before it has
played at real time, and a ``clear`` drops the queued audio and echoes the
marks queued with it (as Twilio does), which were never heard.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from dataclasses import dataclass, field

import websockets
from twilio.request_validator import RequestValidator

from duplex_server.surface import decode_to_pcm16, encode_from_pcm16, resample_pcm16
from protocol.audio_formats import AudioFormat

MULAW = AudioFormat("g711_ulaw", 8000)
FRAME_MS = 20
FRAME_BYTES = 160  # 20 ms of mu-law at 8 kHz
STREAM_PATH = "/v1/telephony/twilio/stream"


def to_mulaw(pcm16: bytes, rate: int) -> bytes:
    return encode_from_pcm16(pcm16, rate, MULAW)


def from_mulaw(mulaw: bytes, rate: int) -> bytes:
    return resample_pcm16(decode_to_pcm16(mulaw, MULAW), 8000, rate)


def signature(token: str, url: str, params: dict[str, str] | None = None) -> str:
    """What Twilio puts in X-Twilio-Signature for ``url`` (its documented scheme)."""
    return RequestValidator(token).compute_signature(url, params or {})


@dataclass
class Played:
    """What the simulated phone did with the server's frames."""

    audio: bytearray = field(default_factory=bytearray)  # mu-law, as heard
    marks_echoed: list[str] = field(default_factory=list)  # after their audio played
    marks_dropped: list[str] = field(default_factory=list)  # echoed by a clear, unheard
    clears: int = 0
    frames: list[dict] = field(default_factory=list)  # every frame the server sent
    arrivals: list[float] = field(default_factory=list)  # each frame's, on the loop's clock


class TwilioPeer:
    """Call ``number`` (1 by default): its CallSid and stream sid are its own,
    so that calls at once do not share them."""

    def __init__(self, socket, number: int = 1) -> None:
        self.socket = socket
        self.stream_sid = f"MZ{number:032x}"
        self.call_sid = f"CA{number:032x}"
        self.sequence = 0
        self.chunk = 0
        self.played = Played()
        self._queue: list[tuple[str, bytes | str]] = []  # ("audio", bytes) | ("mark", name)
        self._changed = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self._player = asyncio.get_running_loop().create_task(self._play())

    @classmethod
    async def dial(cls, base: str, token: str, *, number: int = 1, **parameters: str) -> TwilioPeer:
        """Open the stream as Twilio does (signed upgrade), then ``connected``
        and ``start`` with ``parameters`` as the webhook's ``<Parameter>``s."""
        url = f"ws://{base}{STREAM_PATH}"
        headers = {"X-Twilio-Signature": signature(token, url)}
        socket = await websockets.connect(url, additional_headers=headers)
        peer = cls(socket, number)
        await peer.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await peer.start(parameters)
        return peer

    def _next_sequence(self) -> str:
        self.sequence += 1
        return str(self.sequence)

    async def send(self, frame: dict | str) -> None:
        await self.socket.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def start(self, parameters: dict[str, str]) -> None:
        await self.send(
            {
                "event": "start",
                "sequenceNumber": self._next_sequence(),
                "start": {
                    "accountSid": "AC00000000000000000000000000000001",
                    "streamSid": self.stream_sid,
                    "callSid": self.call_sid,
                    "tracks": ["inbound"],
                    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                    "customParameters": {"call_sid": self.call_sid, **parameters},
                },
                "streamSid": self.stream_sid,
            }
        )

    def media_frame(self, mulaw: bytes, stream_sid: str | None = None) -> dict:
        self.chunk += 1
        return {
            "event": "media",
            "sequenceNumber": self._next_sequence(),
            "media": {
                "track": "inbound",
                "chunk": str(self.chunk),
                "timestamp": str(self.chunk * FRAME_MS),
                "payload": base64.b64encode(mulaw).decode(),
            },
            "streamSid": stream_sid or self.stream_sid,
        }

    async def speak(self, mulaw: bytes) -> None:
        """The caller's audio, a 20 ms frame at a time at real-time pace."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        for at in range(0, len(mulaw), FRAME_BYTES):
            await self.send(self.media_frame(mulaw[at : at + FRAME_BYTES]))
            next_at += FRAME_MS / 1000
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def dtmf(self, digit: str) -> None:
        await self.send(
            {
                "event": "dtmf",
                "streamSid": self.stream_sid,
                "sequenceNumber": self._next_sequence(),
                "dtmf": {"track": "inbound_track", "digit": digit},
            }
        )

    async def stop(self) -> None:
        await self.send(
            {
                "event": "stop",
                "sequenceNumber": self._next_sequence(),
                "streamSid": self.stream_sid,
                "stop": {
                    "accountSid": "AC00000000000000000000000000000001",
                    "callSid": self.call_sid,
                },
            }
        )

    async def _read(self) -> None:
        try:
            loop = asyncio.get_running_loop()
            async for text in self.socket:
                frame = json.loads(text)
                self.played.frames.append(frame)
                self.played.arrivals.append(loop.time())
                assert frame["event"] in ("media", "mark", "clear"), frame  # Twilio's 31924
                assert frame["streamSid"] == self.stream_sid, frame
                if frame["event"] == "media":
                    self._queue.append(("audio", base64.b64decode(frame["media"]["payload"])))
                elif frame["event"] == "mark":
                    self._queue.append(("mark", frame["mark"]["name"]))
                else:
                    await self._clear()
                self._changed.set()
        except websockets.ConnectionClosed:
            pass

    async def _clear(self) -> None:
        self.played.clears += 1
        dropped = [name for kind, name in self._queue if kind == "mark"]
        self._queue.clear()
        for name in dropped:
            self.played.marks_dropped.append(name)  # type: ignore[arg-type]
            await self._echo(name)  # type: ignore[arg-type]

    async def _echo(self, name: str) -> None:
        frame = {
            "event": "mark",
            "sequenceNumber": self._next_sequence(),
            "streamSid": self.stream_sid,
            "mark": {"name": name},
        }
        with contextlib.suppress(websockets.ConnectionClosed):
            await self.send(frame)

    async def _play(self) -> None:
        """Play the queue at real time, a 20 ms slice at a time, echoing marks."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._changed.clear()
                await self._changed.wait()
            kind, item = self._queue[0]
            if kind == "mark":
                self._queue.pop(0)
                self.played.marks_echoed.append(item)  # type: ignore[arg-type]
                await self._echo(item)  # type: ignore[arg-type]
                continue
            audio = item
            assert isinstance(audio, bytes)
            piece, rest = audio[:FRAME_BYTES], audio[FRAME_BYTES:]
            started = loop.time()
            if rest:
                self._queue[0] = ("audio", rest)
            else:
                self._queue.pop(0)
            await asyncio.sleep(len(piece) / 8000 - (loop.time() - started))
            self.played.audio += piece

    async def hang_up(self) -> None:
        self._player.cancel()
        await self.socket.close()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def closed(self, timeout: float = 10) -> None:
        """Wait for the server to end the stream."""
        await asyncio.wait_for(self._reader, timeout)
        self._player.cancel()
