"""A Starlette WebSocket as a session's transport (``attachment.Transport``).

Every socket shell (``realtime.py``, ``sideband.py``, the carrier streams in
``telephony/``) sends through this (and the first two read through
:class:`WebSocketFrames`): a peer that is gone is
:class:`TransportClosed`, whatever the ASGI server raised.
"""

from __future__ import annotations

import asyncio

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from duplex_server.sessions.runtime.attachment import TransportClosed
from protocol.audio_frames import split_delta
from protocol.close_codes import CloseCode
from protocol.codec import encode_server_event
from protocol.dialect import Dialect, negotiate
from protocol.errors import ProtocolError, error_body
from protocol.server_events import Error


class WebSocketTransport:
    """``binary_audio``: the socket asked for binary audio (``?audio=binary``):
    each audio delta goes out as its event with an empty ``delta`` and, right
    after it, the binary frame with the audio (``protocol.audio_frames``).
    The journal holds the JSON events either way; this is the socket's edge."""

    def __init__(self, websocket: WebSocket, binary_audio: bool = False) -> None:
        self.websocket = websocket
        self.binary_audio = binary_audio
        # An event and its audio frame are adjacent: no other send between them.
        self._pair = asyncio.Lock()

    async def send(self, payload: bytes) -> None:
        if not self.binary_audio:
            await self.send_text(payload.decode())
            return
        split = split_delta(payload)
        async with self._pair:
            if split is None:
                await self.send_text(payload.decode())
            else:
                event, frame = split
                await self.send_text(event.decode())
                await self._send_bytes(frame)

    async def send_text(self, text: str) -> None:
        if self.websocket.application_state != WebSocketState.CONNECTED:
            raise TransportClosed()
        try:
            await self.websocket.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise TransportClosed() from exc

    async def _send_bytes(self, data: bytes) -> None:
        if self.websocket.application_state != WebSocketState.CONNECTED:
            raise TransportClosed()
        try:
            await self.websocket.send_bytes(data)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise TransportClosed() from exc

    async def close(self, code: CloseCode, reason: str) -> None:
        if self.websocket.application_state != WebSocketState.CONNECTED:
            return
        try:
            await self.websocket.close(code, reason)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise TransportClosed() from exc


class WebSocketFrames:
    """A Starlette WebSocket's messages as ``realtime.Frames``: text or
    bytes, None once the peer is gone (whichever way the ASGI server says so)."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket

    async def receive(self) -> str | bytes | None:
        try:
            message = await self.websocket.receive()
        except WebSocketDisconnect:
            return None
        if message["type"] == "websocket.disconnect":
            return None
        frame = message.get("text")
        return frame if frame is not None else (message.get("bytes") or b"")


TRUE_VALUES = {"1", "true", "on", "yes"}
FALSE_VALUES = {"0", "false", "off", "no"}


def query_flag(value: str | None, default: bool) -> bool:
    """A query parameter's switch: absent is ``default``; an unknown word
    cannot turn on what is off by default."""
    if value is None:
        return default
    return value.lower() in TRUE_VALUES or (value.lower() not in FALSE_VALUES and default)


def dialect_of(websocket: WebSocket) -> Dialect:
    """Which spelling of OpenAI's events the socket asked for (``?events=``,
    or the ``OpenAI-Beta`` header)."""
    return negotiate(websocket.query_params.get("events"), websocket.headers.get("openai-beta"))


# The upgrade's answer confirms binary audio with this header (a client
# that cannot see it, or an older server that sends none: JSON audio).
AUDIO_HEADER = "x-duplex-audio"


def audio_transport_of(websocket: WebSocket, duplex: bool) -> bool | ProtocolError:
    """Whether the socket asked for binary audio (``?audio=binary``); a
    ProtocolError for a value not served or binary audio off the duplex
    wire: refused, never silently read as JSON."""
    asked = websocket.query_params.get("audio")
    if asked is None or asked.lower() == "json":
        return False
    if asked.lower() != "binary":
        return ProtocolError(
            "invalid_value",
            f"audio={asked!r} is not served; audio=binary or audio=json",
            param="audio",
        )
    if not duplex:
        return ProtocolError(
            "binary_audio_unsupported",
            "binary audio frames are served on the duplex wire only (/v1/duplex or "
            "/v1/realtime?duplex=1); this endpoint carries audio as base64 in JSON",
            param="audio",
        )
    return True


def error_frame(err: ProtocolError) -> bytes:
    """An ``error`` event, for a socket alone (not journaled)."""
    return encode_server_event(Error(error=error_body(err)))
