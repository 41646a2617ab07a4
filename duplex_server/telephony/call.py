"""A phone call as a session: the carrier's media stream, shelled over the session step.

The call is a session on the log like any WebSocket client's, driven by the
same events: the caller's audio becomes ``input_audio_buffer.append`` (a
few carrier frames gathered into one append, as a WebSocket client sends
100 ms at a time), the carrier's echoed marks become ``playback.ack``, a
key the caller presses becomes a user item, ``stop`` (or the socket's end:
a carrier never resumes a stream) becomes ``session.close``. Outbound, the
session's journal is read by :class:`CarrierTransport`, which turns the
answer's audio into the carrier's media frames, each followed by a mark,
and a cleared output (a barge-in) into the carrier's ``clear``. So playback
truth comes from the carrier: the history keeps what the caller heard.

Nothing here knows a carrier's shapes (``telephony/carrier.py``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable

import msgspec
from msgspec import UNSET
from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex_server.outbound import Outbound, read_outbound
from duplex_server.sessions.core.records import CallBody
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.actor import SessionActor
from duplex_server.sessions.runtime.attachment import Attachment
from duplex_server.sessions.runtime.manager import SessionManager
from duplex_server.telephony.call_config import CallConfigs
from duplex_server.telephony.carrier import (
    CallAudio,
    CallConnected,
    CallDigit,
    CallMark,
    CallStarted,
    CallStopped,
    CarrierDialect,
    CarrierFrameError,
    CarrierMessage,
    Ignored,
)
from duplex_server.websocket_transport import WebSocketTransport
from protocol import client_events as ce
from protocol.close_codes import CloseCode
from protocol.dialect import Dialect
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate

log = logging.getLogger(__name__)

# The caller's audio goes to the session this much at a time: a carrier
# sends 20 ms frames, and a log record per 20 ms would cost five times the
# per-append work of a WebSocket client's 100 ms.
APPEND_MS = 100
# mu-law at 8 kHz: a byte a sample.
BYTES_PER_MS = 8
# A carrier frame larger than this is dropped unread (a media frame is 20 ms).
MAX_FRAME_CHARS = 64 * 1024
# The keys of a telephone keypad (DTMF).
DIGITS = frozenset("0123456789*#ABCD")
# Marks of this many cleared answers are remembered (and ignored if echoed).
CLEARED_REMEMBERED = 16


class PlaybackMarks:
    """Which audio a mark stands for. Each mark is named after the answer
    and the end of the audio sent before it (in ms of that answer), so an
    echoed mark is a playback ack as it stands. A cleared answer's marks
    are ignored from the clear on: a carrier may echo the marks of audio it
    dropped, and that audio was never heard."""

    def __init__(self) -> None:
        self._cleared: OrderedDict[str, None] = OrderedDict()

    @staticmethod
    def after(response_id: str, sent_ms: float) -> str:
        """The mark after ``response_id``'s audio up to ``sent_ms``: where the
        session's own ledger says its audio sent ends (in the model's
        samples, which the carrier's 8 kHz bytes cannot spell exactly:
        counted from them, the acks would never cover the answer)."""
        return f"{response_id}@{sent_ms!r}"

    def cleared(self, response_id: str) -> None:
        self._cleared[response_id] = None
        while len(self._cleared) > CLEARED_REMEMBERED:
            self._cleared.popitem(last=False)

    def played(self, name: str) -> ce.PlaybackAck | None:
        """The playback ack an echoed mark means; None for a mark the server
        did not name this way, or one of a cleared answer."""
        response_id, at, end = name.rpartition("@")
        if not at or not response_id or response_id in self._cleared:
            return None
        try:
            played_ms = float(end)
        except ValueError:
            return None
        return ce.PlaybackAck(played_ms=played_ms, response_id=response_id)


class CarrierTransport:
    """The session's events, as the carrier's frames (``attachment.Transport``)."""

    def __init__(
        self, websocket: WebSocket, dialect: CarrierDialect, stream_id: str, marks: PlaybackMarks
    ) -> None:
        self._socket = WebSocketTransport(websocket)
        self._dialect = dialect
        self._stream_id = stream_id
        self._marks = marks

    async def send(self, payload: bytes) -> None:
        event = read_outbound(payload)
        for frame in self._frames(event):
            await self._socket.send_text(frame)

    def _frames(self, event: Outbound) -> list[str]:
        dialect, stream = self._dialect, self._stream_id
        match event.type:
            case "response.output_audio.delta" if event.delta:
                frames = [dialect.media(stream, event.delta)]
                if event.sent_ms is not None:  # every delta's metadata has the ledger
                    mark = self._marks.after(event.response_id, event.sent_ms)
                    frames.append(dialect.mark(stream, mark))
                return frames
            case "output_audio_buffer.cleared":
                self._marks.cleared(event.response_id)
                return [dialect.clear(stream)]
            case "error" if event.error is not None:
                # The carrier cannot be told; the sideband sockets see it too.
                log.warning("call %s: %s: %s", stream, event.error.code, event.error.message)
        return []

    async def close(self, code: CloseCode, reason: str) -> None:
        await self._socket.close(code, reason)


def call_patch(configured: SessionUpdate, audio_format: str) -> SessionUpdate:
    """The session config a call opens with: the configured one, with the
    carrier's audio format both ways (a call's audio is the carrier's, never
    the config's) and, unless configured, speech over the answer cutting it
    (a caller talks over a voice agent to interrupt it)."""
    patch = msgspec.structs.replace(
        configured, input_audio_format=audio_format, output_audio_format=audio_format
    )
    if configured.overlap_policy is UNSET:
        patch = msgspec.structs.replace(patch, overlap_policy="barge_in_on_speech")
    return patch


class Drops:
    """Frames a call drops, and why: each reason is logged the first time
    and then at every power of two, so a peer that floods bad frames
    cannot flood the log."""

    def __init__(self) -> None:
        self.stream = "?"
        self.counts: Counter[str] = Counter()

    def drop(self, reason: str, detail: str = "") -> None:
        """``reason`` is counted (a fixed phrase); ``detail`` (the peer's
        words, in part) is only shown, cut short, so a peer cannot vary it
        into a line per frame."""
        self.counts[reason] += 1
        count = self.counts[reason]
        if count & (count - 1) == 0:
            shown = f"{reason}: {detail[:120]}" if detail else reason
            log.warning("call %s: dropped a frame (%s), %d so far", self.stream, shown, count)


class PhoneCall:
    """One carrier socket, and the session its call is."""

    def __init__(
        self,
        websocket: WebSocket,
        dialect: CarrierDialect,
        manager: SessionManager,
        configs: CallConfigs,
        on_started: Callable[[], None],
    ) -> None:
        self.websocket = websocket
        self.dialect = dialect
        self.manager = manager
        self.configs = configs
        self._on_started = on_started  # the stream left its setup
        self.started: CallStarted | None = None
        self.actor: SessionActor | None = None
        self.attachment: Attachment | None = None
        self.marks = PlaybackMarks()
        self.drops = Drops()
        self._pending = bytearray()  # the caller's audio not yet appended
        self.stopped = False

    async def run(self, start_timeout_s: float) -> None:
        """Read the carrier's frames until the call stops or the socket ends;
        a stream that does not start within ``start_timeout_s`` is closed."""
        try:
            await asyncio.wait_for(self._until_started(), start_timeout_s)
        except TimeoutError:
            log.warning("a media stream sent no start within %g s; closed", start_timeout_s)
            await self.websocket.close(CloseCode.POLICY_VIOLATION, "no start")
            return
        except WebSocketDisconnect:
            return
        if self.actor is None:
            return  # the session could not open; the socket is closed
        try:
            while not self.stopped:
                await self._on_message(await self._receive())
        except WebSocketDisconnect:
            pass
        finally:
            self._hang_up()

    async def _until_started(self) -> None:
        while self.started is None:
            message = await self._receive()
            if isinstance(message, CallStarted):
                await self._start(message)
            elif not isinstance(message, CallConnected | Ignored | None):
                self.drops.drop(f"{type(message).__name__} before start")

    async def _receive(self) -> CarrierMessage | None:
        """The next frame as a message; None for one the call drops."""
        received = await self.websocket.receive()
        if received["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(received.get("code", 1000))
        frame = received.get("text")
        if frame is None:
            frame = received.get("bytes") or b""
        if len(frame) > MAX_FRAME_CHARS:
            self.drops.drop("an oversized frame")
            return None
        try:
            return self.dialect.parse(frame)
        except CarrierFrameError as exc:
            self.drops.drop("unreadable", str(exc))
            return None

    async def _start(self, started: CallStarted) -> None:
        """Open the call's session, with the config of the number called (the
        ``to`` parameter the voice webhook put on the stream)."""
        self.started = started
        self._on_started()
        configured = self.configs.for_number(started.parameters.get("to", ""))
        self.drops.stream = started.stream_id
        self.attachment = Attachment(
            CarrierTransport(self.websocket, self.dialect, started.stream_id, self.marks),
            dialect=Dialect.GA,
        )
        client = self.websocket.client
        try:
            self.actor = await self.manager.open(
                self.attachment,
                call_patch(configured, started.audio_format),
                handshake=False,
                address=client.host if client else "",
                call=CallBody(
                    carrier=self.dialect.name,
                    call_id=started.call_id,
                    stream_id=started.stream_id,
                    caller=started.parameters.get("from", ""),
                    called=started.parameters.get("to", ""),
                ),
            )
        except ProtocolError as err:
            log.warning("call %s: no session for it: %s", started.stream_id, err.message)
            code = (
                CloseCode.TRY_AGAIN_LATER
                if err.code == "resource_exhausted"
                else CloseCode.POLICY_VIOLATION
            )
            await self.attachment.close(code, err.code)
            return
        log.info("call %s: session %s", started.stream_id, self.actor.session_id)

    async def _on_message(self, message: CarrierMessage | None) -> None:
        started = self.started
        assert started is not None
        match message:
            case None | Ignored() | CallConnected():
                return
            case CallStarted():
                self.drops.drop("a second start")
            case _ if message.stream_id != started.stream_id:
                self.drops.drop("a frame of another stream")
            case CallAudio(payload=payload):
                self._hear(payload)
            case CallMark(name=name):
                ack = self.marks.played(name)
                if ack is None:
                    self.drops.drop("a mark the server did not send")
                else:
                    self._post(ack)
            case CallDigit(digit=digit) if digit in DIGITS:
                self._flush()
                self._post(ce.InputDtmf(digit=digit))  # type: ignore[arg-type]  # checked
            case CallDigit():
                self.drops.drop("a key that is no telephone key")
            case CallStopped():
                self._hang_up()

    def _hear(self, payload: str) -> None:
        try:
            self._pending += base64.b64decode(payload, validate=True)
        except binascii.Error:
            self.drops.drop("media that is not base64")
            return
        if len(self._pending) >= APPEND_MS * BYTES_PER_MS:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            audio = base64.b64encode(bytes(self._pending)).decode()
            self._pending.clear()
            self._post(ce.InputAudioAppend(audio=audio))

    def _post(self, event: ce.ClientEvent) -> None:
        assert self.actor is not None and self.attachment is not None
        if not self.actor.post_client(event, self.attachment.generation):
            self.drops.drop("the session's mailbox is full")

    def _hang_up(self) -> None:
        """The call is over (``stop``, or the socket went): the session ends,
        with what the caller said last appended first. A carrier never
        resumes a stream, so no session waits for one."""
        if self.stopped or self.actor is None or self.attachment is None:
            self.stopped = True
            return
        self.stopped = True
        self._flush()
        self._post(ce.SessionClose(reason="call ended"))
        self.actor.post(mb.Detach(self.attachment.generation))
