"""A WebRTC call as a session: a peer connection, shelled over the session step.

The call's data channel (``oai-events``) is a client connection like a
WebSocket: its messages are read by the same :class:`RealtimeConnection`
(so the same events, dialect and rules as OpenAI's endpoint), and the
session's journal is sent back on it by :class:`CallTransport`, except the
answer's audio, which goes to the outbound track instead (OpenAI's WebRTC
sends no audio deltas on the channel). The caller's microphone track
becomes ``input_audio_buffer.append`` (pcm16, 24 kHz, 100 ms a record).

Playback truth comes from the track: when the frame that ends a delta goes
on the wire the call posts a ``playback.ack`` for it, and when the session
clears its output (a barge-in, ``output_audio_buffer.clear``,
``response.cancel``) the track is emptied at once and a truncating ack says
how much of the cut answer was sent. So ``output_audio_buffer.started`` /
``.stopped`` and the history's truncation follow without client acks.

A call whose peer connection fails or closes detaches from its session,
which waits out the disconnect grace for a new offer naming it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from duplex_server.audio import AudioDecodeError, StreamResampler, decode_to_pcm16
from duplex_server.outbound import AUDIO_DELTAS, AUDIO_DONE, read_outbound
from duplex_server.realtime import RealtimeConnection
from duplex_server.sessions.runtime.attachment import TransportClosed
from duplex_server.webrtc.network import RtcNetwork, bind_candidates
from duplex_server.webrtc.tracks import RATE_HZ, AnswerTrack, hear
from duplex_server.websocket_transport import error_frame
from protocol import client_events as ce
from protocol.audio_formats import AudioFormat
from protocol.close_codes import CloseCode
from protocol.dialect import event_type
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)

CHANNEL_LABEL = "oai-events"
# Client events read from the channel but not yet handled; past this the
# channel's messages are dropped (and counted), never queued without bound.
MAX_QUEUED_FRAMES = 256
# Events sent before the channel opened, kept for it (the oldest dropped past this).
MAX_EARLY_EVENTS = 1024
# The channel's send buffer past which the session's sender waits for the
# peer to read (a client that does not read its channel delays only itself).
HIGH_WATER_BYTES = 1 << 20
_CLEARED = b"output_audio_buffer.cleared"
# The session's answers to the call's own playback acks: the data channel is
# OpenAI's endpoint, which defines no such event (the sideband may ask for it).
_UNSENT = frozenset((b"playback.acknowledged",))


class ChannelFrames:
    """The data channel's messages, as :class:`realtime.Frames`."""

    def __init__(self, max_frame_chars: int) -> None:
        self._queue: asyncio.Queue[str | bytes | None] = asyncio.Queue(MAX_QUEUED_FRAMES + 1)
        self._max = max_frame_chars
        self._channel: RTCDataChannel | None = None
        self.dropped = 0

    def attach(self, channel: RTCDataChannel) -> None:
        self._channel = channel
        channel.on("message", self._arrived)
        channel.on("close", self.end)

    def _arrived(self, message: str | bytes) -> None:
        if len(message) > self._max:
            self._drop("payload_too_large", f"a message over {self._max} bytes was dropped")
        elif self._queue.qsize() >= MAX_QUEUED_FRAMES:
            self._drop("rate_limited", "too many events in flight; slow down")
        else:
            self._queue.put_nowait(message)

    def _drop(self, code: str, message: str) -> None:
        """Refuse a message unread: told on the channel and logged the first
        time and at every power of two (a flood gets no error per message)."""
        self.dropped += 1
        if self.dropped & (self.dropped - 1):
            return
        log.warning("webrtc call: dropped %d data channel messages (%s)", self.dropped, code)
        if self._channel is not None and self._channel.readyState == "open":
            detail = f"{message} ({self.dropped} dropped so far)"
            self._channel.send(error_frame(ProtocolError(code, detail)).decode())

    def end(self) -> None:
        """The channel (or the call) is gone: ``receive`` answers None."""
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    async def receive(self) -> str | bytes | None:
        return await self._queue.get()


class CallTransport:
    """The session's events, for the call (``attachment.Transport``)."""

    def __init__(self, call: RtcCall) -> None:
        self._call = call
        self._early: deque[str] = deque(maxlen=MAX_EARLY_EVENTS)
        self._resampler: tuple[str, StreamResampler] | None = None

    async def send(self, payload: bytes) -> None:
        call = self._call
        if call.ended:
            raise TransportClosed()
        kind = event_type(payload)
        if kind in AUDIO_DELTAS:
            self._play(payload)
            return
        if kind in _UNSENT:
            return
        if kind in AUDIO_DONE:
            call.track.finish()
        elif kind == _CLEARED:
            call.cut(read_outbound(payload).response_id)
        await self._send_text(payload.decode())

    def _play(self, payload: bytes) -> None:
        event = read_outbound(payload)
        try:
            pcm = decode_to_pcm16(
                base64.b64decode(event.delta), AudioFormat(event.format, event.sample_rate_hz)
            )
        except (AudioDecodeError, ValueError) as exc:
            log.warning("webrtc call: an answer's audio could not be played: %s", exc)
            return
        if event.sample_rate_hz != RATE_HZ:
            pcm = self._resample(event.response_id, event.sample_rate_hz).push(pcm)
        self._call.track.play(pcm, event.response_id, event.sent_ms)

    def _resample(self, response_id: str, rate: int) -> StreamResampler:
        """One resampler an answer, for answers not at the track's rate."""
        held = self._resampler
        if held is None or held[0] != response_id or held[1].src_hz != rate:
            held = self._resampler = (response_id, StreamResampler(rate, RATE_HZ))
        return held[1]

    async def _send_text(self, text: str) -> None:
        channel = self._call.channel
        if channel is None or channel.readyState == "connecting":
            self._early.append(text)
            return
        if channel.readyState != "open":
            raise TransportClosed()
        self.flush_early()
        channel.send(text)
        if channel.bufferedAmount > HIGH_WATER_BYTES:
            await self._call.drained()

    def flush_early(self) -> None:
        """The channel opened: what the session said before goes first."""
        channel = self._call.channel
        while self._early and channel is not None and channel.readyState == "open":
            channel.send(self._early.popleft())

    async def close(self, code: CloseCode, reason: str) -> None:
        await self._call.close(f"{code.name.lower()}: {reason}" if reason else code.name.lower())


class RtcCall:
    """One peer connection, and the session its call is."""

    def __init__(
        self,
        call_id: str,
        network: RtcNetwork,
        on_ended: Callable[[RtcCall], None],
        max_frame_chars: int,
    ) -> None:
        self.call_id = call_id
        self.pc = RTCPeerConnection(network.configuration())
        self.network = network
        self.track = AnswerTrack(self._sent)
        self.frames = ChannelFrames(max_frame_chars)
        self.transport = CallTransport(self)
        self.channel: RTCDataChannel | None = None
        self.connection: RealtimeConnection | None = None  # set once the session is attached
        self.connected = asyncio.Event()
        self.ended = False
        self._on_ended = on_ended
        self._drained = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.pc.on("datachannel", self._channel_opened)
        self.pc.on("track", self._track_arrived)
        self.pc.on("connectionstatechange", self._state_changed)

    async def answer(self, offer: str) -> str:
        """The answer SDP for ``offer``, its candidates gathered (no trickle)."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        self.pc.addTrack(self.track)
        bind_candidates(self.pc, self.network)
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        return self.pc.localDescription.sdp

    async def run(self, connection: RealtimeConnection, connect_timeout_s: float) -> None:
        """Serve the call until its peer connection ends; one that does not
        connect (ICE and DTLS) within ``connect_timeout_s`` is closed."""
        self.connection = connection
        try:
            await asyncio.wait_for(self.connected.wait(), connect_timeout_s)
        except TimeoutError:
            log.warning(
                "webrtc call %s: not connected within %g s", self.call_id, connect_timeout_s
            )
            self.frames.end()
        try:
            # The session is open already: the handshake deadline never applies.
            await connection.run(connect_timeout_s)
        finally:
            await self.close("the peer connection ended")

    def _channel_opened(self, channel: RTCDataChannel) -> None:
        if channel.label != CHANNEL_LABEL or self.channel is not None:
            log.warning(
                "webrtc call %s: closed a data channel %r", self.call_id, channel.label[:64]
            )
            channel.close()
            return
        self.channel = channel
        channel.bufferedAmountLowThreshold = HIGH_WATER_BYTES // 4
        channel.on("bufferedamountlow", self._drained.set)
        self.frames.attach(channel)
        if channel.readyState == "open":
            self.transport.flush_early()
        else:
            channel.on("open", self.transport.flush_early)

    def _track_arrived(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return  # video is not heard; its packets cost aiortc only
        task = asyncio.get_running_loop().create_task(hear(track, self._heard))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _state_changed(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self.connected.set()
        elif state in ("failed", "closed"):
            log.info("webrtc call %s: peer connection %s", self.call_id, state)
            self.frames.end()

    async def drained(self) -> None:
        self._drained.clear()
        await self._drained.wait()

    def _heard(self, pcm: bytes) -> None:
        self._post(
            ce.InputAudioAppend(
                audio=base64.b64encode(pcm).decode(), format="pcm16", sample_rate_hz=RATE_HZ
            )
        )

    def _sent(self, response_id: str, ledger_ms: float) -> None:
        """A delta's last frame went on the wire: it is played, as far as the
        server can know."""
        self._post(ce.PlaybackAck(played_ms=ledger_ms, response_id=response_id))

    def cut(self, response_id: str) -> None:
        """The session cleared ``response_id``'s output: silence from the
        next frame, and the answer acknowledged (truncated) at what was sent."""
        sent = self.track.clear()
        if sent is not None and sent.response_id == response_id:
            self._post(
                ce.PlaybackAck(played_ms=sent.ms, response_id=sent.response_id, truncate=True)
            )

    def _post(self, event: ce.ClientEvent) -> None:
        connection = self.connection
        if connection is None or connection.actor is None or self.ended:
            return
        if not connection.actor.post_client(event, connection.attachment.generation):
            log.warning("webrtc call %s: the session's mailbox is full", self.call_id)

    def hang_up(self) -> None:
        """``POST …/hangup``: the session ends (``session.close``: its
        ``session.closed`` goes out on the channel, then the actor closes the
        call's transport, so the peer connection)."""
        connection = self.connection
        if connection is not None and connection.actor is not None:
            self._post(ce.SessionClose(reason="hangup"))
        else:
            self.frames.end()

    async def close(self, why: str) -> None:
        if self.ended:
            return
        self.ended = True
        log.info("webrtc call %s: closed (%s)", self.call_id, why)
        self.frames.end()
        self.track.stop()
        for task in list(self._tasks):
            task.cancel()
        await self.pc.close()
        self._on_ended(self)
