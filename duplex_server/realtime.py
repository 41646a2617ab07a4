"""``WS /v1/realtime`` and ``WS /v1/duplex``: the socket shell around the actor.

This module only moves frames: it decodes each one, routes it to the
session's mailbox (or to the manager for open/resume) and reports the
socket's end. Everything else happens in the actor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from typing import Protocol

import msgspec
from msgspec import UNSET
from starlette.websockets import WebSocket

from duplex_server import metrics
from duplex_server.auth import ANONYMOUS, Principal, authenticate, denial
from duplex_server.config import ServerConfig
from duplex_server.http_errors import protocol_refusal, refusal
from duplex_server.sessions.core.records import CallBody
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.actor import SessionActor
from duplex_server.sessions.runtime.attachment import Attachment
from duplex_server.sessions.runtime.input_budget import REFUSAL_PAUSE_S
from duplex_server.sessions.runtime.manager import SessionManager
from duplex_server.sideband import serve_sideband
from duplex_server.websocket_transport import (
    AUDIO_HEADER,
    WebSocketFrames,
    WebSocketTransport,
    audio_transport_of,
    dialect_of,
    error_frame,
    query_flag,
)
from protocol.audio_frames import read_append
from protocol.client_events import (
    AnyClientEvent,
    SessionHeartbeat,
    SessionResume,
    SessionUpdateEvent,
)
from protocol.close_codes import CloseCode
from protocol.codec import FrameDecoder
from protocol.errors import INVALID_REQUEST, ProtocolError
from protocol.session_config import ExtraBody, SessionType, SessionUpdate

log = logging.getLogger(__name__)

# ?intent= values: OpenAI's "transcription", and "realtime" (a conversation).
INTENTS: dict[str, SessionType] = {"transcription": "transcription", "realtime": "realtime"}

# Resume refusals that a token guesser collects; a socket gets this many.
GUESSES = ("invalid_resume_token", "invalid_session_resume", "forbidden")
MAX_FAILED_RESUMES = 5


class Frames(Protocol):
    """A client's events as they arrive: a WebSocket's messages, or a WebRTC
    data channel's (``webrtc/call.py``)."""

    async def receive(self) -> str | bytes | None:
        """The next frame; None once the peer is gone."""
        ...


@dataclasses.dataclass(frozen=True)
class Peer:
    """Who is on the other end of a connection, and how its session opens."""

    principal: Principal  # sessions it opens are its; it resumes only its own
    address: str
    duplex: bool = True  # the duplex wire; False: OpenAI's endpoint and semantics
    # ?duplex_events=1 on the OpenAI endpoint: the session opts in to the
    # extension events, as extra_body.duplex_events does.
    duplex_events: bool = False
    bound: SessionUpdate | None = None  # a client secret's session config: it opens with it
    call: CallBody | None = None  # a call's ids (WebRTC): the sideband finds it by them
    # ?audio=binary (duplex wire only): a binary frame is an audio frame
    # (protocol.audio_frames), else it is read as JSON like a text frame.
    binary_audio: bool = False
    # ?intent=transcription (OpenAI's beta spelling of GA's session.type):
    # the session opens as a transcription session unless its patch says.
    session_type: SessionType | None = None


class RealtimeConnection:
    """One client connection: at most one session attached at a time."""

    def __init__(
        self,
        frames: Frames,
        attachment: Attachment,
        peer: Peer,
        manager: SessionManager,
        decoder: FrameDecoder,
        limits: ServerConfig,
    ) -> None:
        self.frames = frames
        self.peer = peer
        self.principal = peer.principal
        self.bound = peer.bound
        self.limits = limits
        self.failed_resumes = 0
        self._flood_pause_s = 0.0  # set when the mailbox refused a frame
        self.duplex = peer.duplex
        self.manager = manager
        self.decoder = decoder
        self.attachment = attachment
        self.actor: SessionActor | None = None

    async def open(self, patch: SessionUpdate) -> bool:
        """Open the connection's session now (autostart), with ``patch``
        (a client secret's config, when the key was one, comes first)."""
        return await self._open(self.bound or patch, handshake=False)

    async def run(self, handshake_timeout_s: float) -> None:
        """Read frames into the session until the peer is gone; until a
        session is open, for at most ``handshake_timeout_s`` (a socket that
        never opens one would hold its slot forever)."""
        deadline = asyncio.get_running_loop().time() + handshake_timeout_s
        try:
            while True:
                try:
                    frame = await self._receive(deadline)
                except TimeoutError:
                    await self._handshake_timed_out(handshake_timeout_s)
                    break
                if frame is None:
                    break
                await self._on_frame(frame)
                await self._throttle()
        finally:
            if self.actor is not None:
                self.actor.post(mb.Detach(self.attachment.generation))

    async def _receive(self, deadline: float) -> str | bytes | None:
        if self.actor is not None:
            return await self.frames.receive()
        remaining = deadline - asyncio.get_running_loop().time()
        return await asyncio.wait_for(self.frames.receive(), max(0.0, remaining))

    async def _handshake_timed_out(self, timeout_s: float) -> None:
        await self._send_error(
            ProtocolError(
                "config_timeout",
                f"no session was opened within {timeout_s:g} s: send session.update "
                "(or session.resume) first",
            )
        )
        await self.attachment.close(CloseCode.POLICY_VIOLATION, "config_timeout")

    async def _failed_resume(self, request: SessionResume) -> None:
        """A wrong token or another key's session: counted per socket, logged
        once, and the socket closed at ``MAX_FAILED_RESUMES`` (guessing tokens
        costs a new connection each few tries, under the per-address caps)."""
        self.failed_resumes += 1
        if self.failed_resumes == 1:
            client = self.peer.address or "?"
            log.warning("failed resume of %s from %s", request.session_id[:48], client)
        if self.failed_resumes >= MAX_FAILED_RESUMES:
            log.warning("closing a socket after %d failed resumes", self.failed_resumes)
            await self.attachment.close(CloseCode.POLICY_VIOLATION, "too many failed resumes")

    async def _send_error(self, err: ProtocolError) -> None:
        err.forget_traceback()
        await self.attachment.send_now(error_frame(err))

    async def open_session(self, patch: SessionUpdate, handshake: bool = False) -> SessionActor:
        """Open the connection's session (ProtocolError: why not), under the
        server's, the key's and the address's caps."""
        if self.peer.duplex_events:
            patch = with_duplex_events(patch)
        if self.peer.session_type is not None and patch.type is UNSET:
            patch = msgspec.structs.replace(patch, type=self.peer.session_type)
        self.actor = await self.manager.open(
            self.attachment,
            patch,
            handshake,
            openai_semantics=not self.duplex,
            owner=None if self.principal.name == ANONYMOUS.name else self.principal.name,
            owner_quota=self.principal.max_sessions or self.limits.max_sessions_per_key,
            address=self.peer.address,
            address_quota=self.limits.max_sessions_per_ip,
            call=self.peer.call,
        )
        return self.actor

    async def resume_session(self, request: SessionResume) -> SessionActor:
        """Attach the connection to the session ``request`` names, if the
        caller owns it (ProtocolError: why not)."""
        self.actor = await self.manager.resume(self.attachment, request, self.principal.owns)
        return self.actor

    async def _open(
        self, patch: SessionUpdate, handshake: bool, event_id: str | None = None
    ) -> bool:
        try:
            await self.open_session(patch, handshake)
        except ProtocolError as err:
            err.event_id = err.event_id or event_id
            await self._send_error(err)
            if not (handshake and err.error_class == INVALID_REQUEST):
                # A request that cannot succeed is no reason to retry later.
                refused = err.error_class == INVALID_REQUEST
                code = CloseCode.POLICY_VIOLATION if refused else CloseCode.TRY_AGAIN_LATER
                await self.attachment.close(code, err.code)
            # else: the client's session.update was refused; it may send a better one
            return False
        return True

    def _decode(self, frame: str | bytes) -> AnyClientEvent:
        """The frame's event: an audio frame is the append it carries."""
        if self.peer.binary_audio and isinstance(frame, bytes):
            return read_append(frame, self.decoder.max_frame_bytes)
        return self.decoder.decode(frame)

    async def _on_frame(self, frame: str | bytes) -> None:
        try:
            event = self._decode(frame)
        except ProtocolError as err:
            metrics.CLIENT_EVENTS.labels("undecodable").inc()
            if self.actor is None:
                await self._send_error(err)
            elif not self.actor.post_reject(err, self.attachment.generation):
                await self._refuse_flood()
            return
        metrics.CLIENT_EVENTS.labels(event.type).inc()
        if isinstance(event, SessionResume):
            await self._resume(event)
        elif self.actor is None:
            if isinstance(event, SessionUpdateEvent) and self.bound is not None:
                # The secret's config opens the session; the client's update follows it.
                if await self._open(self.bound, handshake=False, event_id=event.event_id):
                    await self._on_frame(frame)
            elif isinstance(event, SessionUpdateEvent):
                await self._open(event.session, handshake=True, event_id=event.event_id)
            else:
                await self._send_error(
                    ProtocolError(
                        "session_not_open",
                        "send session.update (or session.resume) first: no session is open",
                        param="type",
                        event_id=event.event_id,
                    )
                )
        elif isinstance(event, SessionHeartbeat):
            if not self.actor.heartbeat(self.attachment.generation):
                await self._refuse_flood(event.event_id)
        elif not self.actor.post_client(event, self.attachment.generation):
            await self._refuse_flood(event.event_id)

    async def _throttle(self) -> None:
        """Read a session past its input budget, or with its mailbox full, no
        faster than it is refused: what it sends meanwhile waits in its own
        TCP buffer (runtime/input_budget.py says why)."""
        if self.actor is None:
            return
        pause = max(self.actor.read_pause_s(), self._flood_pause_s)
        self._flood_pause_s = 0.0
        if pause > 0:
            await asyncio.sleep(pause)

    async def _refuse_flood(self, event_id: str | None = None) -> None:
        """The mailbox is full: refuse the frame, and pause reading (``_throttle``)."""
        self._flood_pause_s = REFUSAL_PAUSE_S
        await self._send_error(
            ProtocolError("rate_limited", "too many events in flight; slow down", event_id=event_id)
        )

    async def _resume(self, request: SessionResume) -> None:
        previous = self.actor
        if previous is not None and previous.session_id == request.session_id:
            await self._send_error(
                ProtocolError(
                    "session_resume_conflict",
                    "this socket is already attached to that session",
                    param="session_id",
                    event_id=request.event_id,
                )
            )
            return
        fresh = Attachment(self.attachment.transport, dialect=self.attachment.dialect)
        try:
            actor = await self.manager.resume(fresh, request, self.principal.owns)
        except ProtocolError as err:
            metrics.RESUMES.labels(err.code).inc()
            await self._send_error(err)
            if err.code in GUESSES:
                await self._failed_resume(request)
            return
        if previous is not None:
            # The socket's autostarted session is abandoned for the resumed one.
            await self.attachment.stop()
            previous.post(mb.Detach(self.attachment.generation))
            previous.end("client_close")
        metrics.RESUMES.labels("resumed").inc()
        self.attachment = fresh
        self.actor = actor


def with_duplex_events(patch: SessionUpdate) -> SessionUpdate:
    """The opening patch with ``extra_body.duplex_events`` on, unless the
    client's own patch says otherwise."""
    extra = patch.extra_body if isinstance(patch.extra_body, ExtraBody) else ExtraBody()
    if extra.duplex_events is not UNSET:
        return patch
    return msgspec.structs.replace(
        patch, extra_body=msgspec.structs.replace(extra, duplex_events=True)
    )


async def _refuse(websocket: WebSocket, err: ProtocolError) -> None:
    """A socket whose URL asks for what the server does not serve: told, closed."""
    await websocket.send_text(error_frame(err).decode())
    await websocket.close(CloseCode.POLICY_VIOLATION, err.code)


def intent_refusal(intent: str | None) -> ProtocolError | None:
    """The refusal of an ``?intent=`` this server does not serve."""
    if intent is None or intent in INTENTS:
        return None
    return ProtocolError(
        "invalid_value",
        f"intent {intent!r} is not one this server serves: {', '.join(INTENTS)}",
        param="intent",
    )


async def realtime_endpoint(websocket: WebSocket) -> None:
    """One socket; a client address holds at most ``max_connections_per_ip``
    of them (more: HTTP 429 with Retry-After), and a browser page may open
    one only from an allowed Origin (else HTTP 403), both before the upgrade."""
    app_state = websocket.app.state
    address = websocket.client.host if websocket.client else ""
    sockets: Counter[str] = app_state.sockets_per_address
    cap = app_state.config.max_connections_per_ip
    if cap and sockets[address] >= cap:
        metrics.ADMISSIONS_REFUSED.labels("address_sockets").inc()
        await websocket.send_denial_response(
            refusal(429, "rate_limited", f"{cap} connections are open from this address")
        )
        return
    origin = websocket.headers.get("origin")
    allowed = app_state.config.allowed_origins
    if allowed and origin is not None and origin not in allowed:
        metrics.ADMISSIONS_REFUSED.labels("origin").inc()
        # A page elsewhere must not drive a user's browser into this server.
        await websocket.send_denial_response(
            refusal(403, "origin_not_allowed", f"origin {origin!r} is not allowed")
        )
        return
    sockets[address] += 1
    try:
        await _serve_socket(websocket)
    finally:
        sockets[address] -= 1
        if not sockets[address]:
            del sockets[address]


async def _serve_socket(websocket: WebSocket) -> None:
    app_state = websocket.app.state
    principal, bound = authenticate(websocket)
    refused = denial(principal, "realtime")
    if refused is not None:
        # Refused before the upgrade: no half-open socket for a wrong key.
        status, err = refused
        metrics.ADMISSIONS_REFUSED.labels(err.code).inc()
        await websocket.send_denial_response(protocol_refusal(status, err))
        return
    assert principal is not None  # denial() refuses a missing caller
    offered = websocket.scope.get("subprotocols", [])
    subprotocol = "realtime" if "realtime" in offered else None
    params = websocket.query_params
    duplex = websocket.url.path.rstrip("/").endswith("/v1/duplex") or query_flag(
        params.get("duplex"), False
    )
    binary = audio_transport_of(websocket, duplex and "call_id" not in params)
    autostart = query_flag(params.get("autostart"), True) and "resume" not in params
    if autostart and "call_id" not in params:
        # A socket that would open a session the server cannot take is
        # answered before its upgrade: 503 or 429 in OpenAI's error shape,
        # with Retry-After (a resume or a sideband socket opens no session)
        full = _admission_refusal(websocket, principal)
        if full is not None:
            await websocket.send_denial_response(protocol_refusal(*full))
            return
    confirm = [(AUDIO_HEADER.encode(), b"binary")] if binary is True else None
    await websocket.accept(subprotocol=subprotocol, headers=confirm)
    intent = params.get("intent")
    if isinstance(binary, ProtocolError):
        await _refuse(websocket, binary)
        return
    if (refused_intent := intent_refusal(intent)) is not None:
        await _refuse(websocket, refused_intent)
        return
    if "call_id" in params:
        await serve_sideband(websocket, principal, params["call_id"])
        return
    peer = Peer(
        principal,
        websocket.client.host if websocket.client else "",
        duplex=duplex,
        duplex_events=query_flag(params.get("duplex_events"), False),
        bound=bound,
        binary_audio=binary,
        session_type=INTENTS.get(intent or ""),
    )
    transport = WebSocketTransport(websocket, binary_audio=binary)
    attachment = Attachment(transport, dialect=dialect_of(websocket))
    connection = RealtimeConnection(
        WebSocketFrames(websocket),
        attachment,
        peer,
        app_state.manager,
        app_state.decoder,
        app_state.config,
    )
    model = params.get("model")
    if autostart and not await connection.open(
        SessionUpdate(model=model) if model else SessionUpdate()
    ):
        return
    await connection.run(app_state.config.handshake_timeout_s)


def _admission_refusal(
    websocket: WebSocket, principal: Principal
) -> tuple[int, ProtocolError] | None:
    """The manager's refusal of a new session for this caller, if any."""
    config = websocket.app.state.config
    return websocket.app.state.manager.admission_refusal(
        None if principal.name == ANONYMOUS.name else principal.name,
        principal.max_sessions or config.max_sessions_per_key,
        websocket.client.host if websocket.client else "",
        config.max_sessions_per_ip,
    )
