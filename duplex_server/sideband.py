"""``WS /v1/realtime?call_id=…``: a server application watching and steering a call.

OpenAI's sideband connection: beside the caller's own connection (a phone
call's media stream, later a WebRTC peer), a server application opens a
WebSocket naming the call and, from then on, sees the session's events as
they are journaled and may steer it with ``session.update``,
``conversation.item.create`` (a ``function_call_output`` among them: that is
how tools run against a phone call), ``response.create`` and
``response.cancel``. It never carries audio and never replaces the caller's
socket; when the call ends, its sideband sockets are closed with it.

``call_id`` is the call's own id (a Twilio CallSid) or its session's id.
"""

from __future__ import annotations

from starlette.websockets import WebSocket

from duplex_server.auth import Principal
from duplex_server.sessions.core.event_dialect import UNASKED_EXTENSIONS
from duplex_server.sessions.runtime.actor import SessionActor
from duplex_server.sessions.runtime.attachment import Attachment
from duplex_server.websocket_transport import (
    WebSocketFrames,
    WebSocketTransport,
    dialect_of,
    error_frame,
    query_flag,
)
from protocol import client_events as ce
from protocol.close_codes import CloseCode
from protocol.dialect import event_type
from protocol.errors import ProtocolError
from protocol.server_events import PlaybackAcknowledged

# What a sideband socket may send: it steers the call, the caller streams it.
STEERING = (ce.SessionUpdateEvent, ce.ItemCreate, ce.ResponseCreate, ce.ResponseCancel)
# A call's session speaks the duplex wire (its carrier acks playback): what
# OpenAI does not define is kept from a sideband socket on OpenAI's endpoint,
# unless it asks for the extensions (``?duplex=1`` or ``?duplex_events=1``).
EXTENSION_TYPES = frozenset(
    cls.__struct_config__.tag.encode()  # type: ignore[union-attr]
    for cls in (*UNASKED_EXTENSIONS, PlaybackAcknowledged)
)


class OpenAITypesOnly(WebSocketTransport):
    """A socket that is sent only the event types OpenAI defines."""

    async def send(self, payload: bytes) -> None:
        if event_type(payload) not in EXTENSION_TYPES:
            await super().send(payload)


async def serve_sideband(websocket: WebSocket, principal: Principal, call_id: str) -> None:
    """The accepted socket, watching ``call_id`` until either ends."""
    state = websocket.app.state
    params = websocket.query_params
    extensions = any(query_flag(params.get(name), False) for name in ("duplex", "duplex_events"))
    transport = WebSocketTransport(websocket) if extensions else OpenAITypesOnly(websocket)
    attachment = Attachment(transport, dialect=dialect_of(websocket))
    actor = state.manager.actor_for_call(call_id)
    refusal = _watch(actor, principal, call_id, attachment)
    if refusal is not None:
        await attachment.send_now(error_frame(refusal))
        busy = refusal.code == "resource_exhausted"
        await attachment.close(
            CloseCode.TRY_AGAIN_LATER if busy else CloseCode.POLICY_VIOLATION, refusal.code
        )
        return
    assert actor is not None  # _watch refuses a missing call
    try:
        await _steer(websocket, attachment, actor)
    finally:
        await actor.socket.unwatch(attachment)


def _watch(
    actor: SessionActor | None, principal: Principal, call_id: str, attachment: Attachment
) -> ProtocolError | None:
    """Attach ``attachment`` to the call as a sideband socket, or say why not."""
    if actor is None:
        return ProtocolError(
            "call_not_found", f"no live call {call_id[:64]!r} on this server", param="call_id"
        )
    if not principal.owns(actor.state.owner):
        return ProtocolError("forbidden", "this call was opened with another key", param="call_id")
    if not actor.socket.watch(attachment):
        return ProtocolError("resource_exhausted", "this call has its sideband sockets")
    return None


async def _steer(websocket: WebSocket, attachment: Attachment, actor: SessionActor) -> None:
    """Read the application's events into the call's session, refusing what
    a sideband socket may not send (answered on this socket alone)."""
    decoder = websocket.app.state.decoder
    frames = WebSocketFrames(websocket)
    while (frame := await frames.receive()) is not None:
        try:
            event = decoder.decode(frame)
        except ProtocolError as err:
            await attachment.send_now(error_frame(err))
            continue
        if not isinstance(event, STEERING):
            refused = ProtocolError(
                "sideband_event_not_allowed",
                f"a sideband socket steers a call and cannot send {event.type}: it may send "
                "session.update, conversation.item.create, response.create, response.cancel",
                param="type",
                event_id=event.event_id,
            )
            await attachment.send_now(error_frame(refused))
        elif not actor.post_client(event, attachment.generation):
            busy = ProtocolError(
                "rate_limited", "too many events in flight", event_id=event.event_id
            )
            await attachment.send_now(error_frame(busy))
