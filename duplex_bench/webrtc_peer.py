"""A WebRTC caller as OpenAI's WebRTC guide has a browser do it, on aiortc
(the tests' client and the WebRTC bench's callers).

``WebRtcPeer.call`` makes a peer connection with a data channel named
``oai-events`` and one audio transceiver, posts the offer (every candidate
gathered) to ``POST /v1/realtime/calls`` and applies the answer. Its
microphone is a track that plays what :meth:`speak` queues at real time
(20 ms frames, silence between); what the server sends is heard on the
remote track and kept as 24 kHz pcm16 (``heard``, with when each frame
arrived), and the data channel's events are kept in order (``events``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
from dataclasses import dataclass, field
from typing import Any

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

RATE_HZ = 24_000
FRAME_SAMPLES = RATE_HZ // 50  # 20 ms
FRAME_BYTES = FRAME_SAMPLES * 2
CALLS_PATH = "/v1/realtime/calls"


class Microphone(MediaStreamTrack):
    """Queued speech, then silence, as 20 ms frames at real time."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pending = bytearray()
        self._start: float | None = None
        self._frames = 0
        self.spoken = asyncio.Event()  # set when the queue runs dry

    def say(self, pcm16: bytes) -> None:
        self._pending += pcm16
        self.spoken.clear()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        due = self._start + self._frames * 0.02
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        chunk = bytes(self._pending[:FRAME_BYTES]).ljust(FRAME_BYTES, b"\0")
        del self._pending[:FRAME_BYTES]
        if not self._pending:
            self.spoken.set()
        frame = av.AudioFrame.from_ndarray(
            np.frombuffer(chunk, dtype="<i2").reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = RATE_HZ
        frame.pts = self._frames * FRAME_SAMPLES
        frame.time_base = fractions.Fraction(1, RATE_HZ)
        self._frames += 1
        return frame


@dataclass
class Heard:
    """The answer as the caller's track received it."""

    audio: bytearray = field(default_factory=bytearray)  # 24 kHz pcm16
    arrivals: list[tuple[float, float]] = field(default_factory=list)  # (loop time, rms)


@dataclass
class WebRtcPeer:
    pc: RTCPeerConnection
    microphone: Microphone
    call_id: str
    location: str
    base_url: str
    key: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    heard: Heard = field(default_factory=Heard)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def call(
        cls,
        base_url: str,
        *,
        key: str | None = None,
        session: dict[str, Any] | None = None,
        query: str = "",
        timeout_s: float = 20.0,
    ) -> WebRtcPeer:
        """Dial: the offer posted as bare SDP, or as OpenAI's multipart form
        when ``session`` is given; raises ``CallRefused`` for a non-201."""
        pc = RTCPeerConnection()
        channel = pc.createDataChannel("oai-events")
        microphone = Microphone()
        pc.addTransceiver(microphone, direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())
        response = await post_offer(
            base_url, pc.localDescription.sdp, key=key, session=session, query=query
        )
        if response.status_code != 201:
            await pc.close()
            raise CallRefused(response.status_code, response.json())
        location = response.headers["location"]
        peer = cls(pc, microphone, location.rsplit("/", 1)[-1], location, base_url, key)
        channel.on("message", peer._event)
        pc.on("track", peer._track)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
        peer.channel = channel
        await peer._until(lambda: channel.readyState == "open", timeout_s)
        return peer

    channel: Any = None

    def _event(self, message: str | bytes) -> None:
        self.events.append(json.loads(message))
        self._changed.set()

    def _track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.get_running_loop().create_task(self._listen(track)))

    async def _listen(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE_HZ)
        loop = asyncio.get_running_loop()
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            for mono in resampler.resample(frame):  # type: ignore[arg-type]
                samples = mono.to_ndarray().reshape(-1)
                self.heard.audio += samples.astype("<i2").tobytes()
                rms = float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))
                self.heard.arrivals.append((loop.time(), rms))
            self._changed.set()

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def speak(self, pcm16: bytes) -> None:
        """Say ``pcm16`` (24 kHz) into the microphone, after what is queued."""
        self.microphone.say(pcm16)

    def types(self) -> list[str]:
        return [event["type"] for event in self.events]

    async def next_event(self, kind: str, after: int = 0, timeout_s: float = 30.0) -> dict:
        """The first ``kind`` event at index ``after`` or later."""
        found: list[dict] = []

        def seen() -> bool:
            found[:] = [e for e in self.events[after:] if e["type"] == kind][:1]
            return bool(found)

        await self._until(seen, timeout_s)
        return found[0]

    async def _until(self, check, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not check():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError("the call did not get there in time")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.1))

    async def hang_up(self) -> httpx.Response:
        """``POST {location}/hangup`` (the call's session ends), then close."""
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"{self.base_url}{self.location}/hangup", headers=headers)
        await self.close()
        return response

    async def close(self) -> None:
        """Drop the peer connection (as a browser tab closing): the session
        waits for a new offer within its disconnect grace."""
        await self.pc.close()
        for task in self._tasks:
            task.cancel()


class CallRefused(Exception):
    def __init__(self, status: int, body: dict) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


async def post_offer(
    base_url: str,
    sdp: str,
    *,
    key: str | None = None,
    session: dict[str, Any] | None = None,
    query: str = "",
    content_type: str = "application/sdp",
) -> httpx.Response:
    """``POST /v1/realtime/calls`` as OpenAI's guide writes it."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{base_url}{CALLS_PATH}" + (f"?{query}" if query else "")
    async with httpx.AsyncClient(timeout=30) as client:
        if session is None:
            headers["Content-Type"] = content_type
            return await client.post(url, content=sdp.encode(), headers=headers)
        form = {"sdp": sdp, "session": json.dumps(session)}
        return await client.post(
            url, files={k: (None, v) for k, v in form.items()}, headers=headers
        )
