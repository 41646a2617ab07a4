"""A call's audio: the caller's microphone into the session, the answer out to them.

Inbound, aiortc decodes the browser's Opus into 48 kHz frames; they are
resampled to the session's pcm16 at 24 kHz and handed on 100 ms at a time
(one log record per 100 ms, as a WebSocket client's appends).

Outbound, :class:`AnswerTrack` is the track aiortc encodes to Opus. aiortc's
sender asks it for the next frame as soon as it sent the last, so the track
keeps the pace itself: frame *n* is handed over at the call's start plus
*n* × 20 ms, silence when no answer is queued. It knows which answer's
audio it put on the wire and when: the call acknowledges playback from
that (what was sent; the browser's jitter buffer, tens of ms, is not
modelled), and a barge-in empties the queue, so the track falls silent at
its next frame.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fractions
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from duplex_server import metrics

RATE_HZ = 24_000  # the session's pcm16, both ways
FRAME_MS = 20
FRAME_SAMPLES = RATE_HZ * FRAME_MS // 1000
FRAME_BYTES = FRAME_SAMPLES * 2
BYTES_PER_MS = RATE_HZ * 2 / 1000
APPEND_BYTES = RATE_HZ * 2 // 10  # 100 ms of the caller's audio a record
# A track further behind its clock than this starts the clock again rather
# than sending the backlog in a burst (the receiver would drop it anyway).
RESYNC_S = 0.2
_TIME_BASE = fractions.Fraction(1, RATE_HZ)
_SILENCE = bytes(FRAME_BYTES)


@dataclasses.dataclass(frozen=True)
class QueuedFrame:
    pcm: bytes  # 20 ms
    response_id: str
    ends_ms: float  # the answer's audio up to this frame's end
    acks: float | None = None  # the session's ledger, when this frame ends a delta


@dataclasses.dataclass(frozen=True)
class Sent:
    """The last answer audio put on the wire."""

    response_id: str
    ms: float


class AnswerTrack(MediaStreamTrack):
    """The answer's audio as 20 ms frames, paced on the event loop's clock.

    ``on_sent(response_id, sent_ms)`` is called when a frame that ends a
    delta goes out, with the session's ledger for it."""

    kind = "audio"

    def __init__(self, on_sent: Callable[[str, float], None]) -> None:
        super().__init__()
        self._on_sent = on_sent
        self._queue: deque[QueuedFrame] = deque()
        self._partial = bytearray()  # the current answer's audio short of a frame
        self._answer = ""  # the answer the partial frame belongs to
        self._placed_ms = 0.0  # of the current answer, queued so far
        self._pending_acks: deque[tuple[float, float]] = deque()  # (ends_ms, ledger)
        self._clock: float | None = None
        self._frames = 0
        self.sent: Sent | None = None

    @property
    def queued_ms(self) -> float:
        return len(self._queue) * FRAME_MS + len(self._partial) / BYTES_PER_MS

    def play(self, pcm: bytes, response_id: str, ledger_ms: float | None) -> None:
        """Queue ``pcm`` (24 kHz) of ``response_id``; ``ledger_ms``: the
        session's sent_ms after it, acknowledged once its end is on the wire."""
        if response_id != self._answer:
            self.finish()
            self._answer, self._placed_ms = response_id, 0.0
        self._partial += pcm
        end_ms = self._placed_ms + len(self._partial) / BYTES_PER_MS
        if ledger_ms is not None:
            self._pending_acks.append((end_ms, ledger_ms))
        while len(self._partial) >= FRAME_BYTES:
            self._queue_frame(bytes(self._partial[:FRAME_BYTES]))
            del self._partial[:FRAME_BYTES]

    def finish(self) -> None:
        """The current answer's audio is all here: its last frame, padded."""
        if self._partial:
            audio_ms = len(self._partial) / BYTES_PER_MS
            padded = bytes(self._partial) + bytes(FRAME_BYTES - len(self._partial))
            self._partial.clear()
            self._queue_frame(padded, audio_ms)

    def _queue_frame(self, pcm: bytes, audio_ms: float = FRAME_MS) -> None:
        self._placed_ms += audio_ms
        acks = None
        while self._pending_acks and self._pending_acks[0][0] <= self._placed_ms + 1e-6:
            acks = self._pending_acks.popleft()[1]
        self._queue.append(QueuedFrame(pcm, self._answer, self._placed_ms, acks))

    def clear(self) -> Sent | None:
        """Drop every frame not yet sent; what was sent of the answer cut."""
        self._queue.clear()
        self._partial.clear()
        self._pending_acks.clear()
        self._answer = ""
        return self.sent

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._clock is None:
            self._clock = loop.time()
        due = self._clock + self._frames * FRAME_MS / 1000
        now = loop.time()
        if due > now:
            await asyncio.sleep(due - now)
        late = max(0.0, loop.time() - due)
        metrics.RTC_FRAME_LATENESS.observe(late)
        if late > FRAME_MS / 1000:
            metrics.RTC_UNDERRUNS.inc()
        if late > RESYNC_S:
            self._clock, self._frames = loop.time(), 0
        pcm = self._next()
        frame = av.AudioFrame.from_ndarray(
            np.frombuffer(pcm, dtype="<i2").reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = RATE_HZ
        frame.pts = self._frames * FRAME_SAMPLES
        frame.time_base = _TIME_BASE
        self._frames += 1
        return frame

    def _next(self) -> bytes:
        if not self._queue:
            return _SILENCE
        queued = self._queue.popleft()
        self.sent = Sent(queued.response_id, queued.ends_ms)
        if queued.acks is not None:
            self._on_sent(queued.response_id, queued.acks)
        return queued.pcm


async def hear(track: MediaStreamTrack, on_audio: Callable[[bytes], None]) -> None:
    """Read the caller's track until it ends, handing on 100 ms of pcm16
    (24 kHz, mono) at a time, and what is left at the end."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE_HZ)
    pending = bytearray()
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            break
        for mono in resampler.resample(frame):  # type: ignore[arg-type]  # an AudioFrame
            pending += mono.to_ndarray().tobytes()
        while len(pending) >= APPEND_BYTES:
            on_audio(bytes(pending[:APPEND_BYTES]))
            del pending[:APPEND_BYTES]
    if pending:
        on_audio(bytes(pending))
