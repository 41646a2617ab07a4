"""``POST /v1/realtime/calls`` and ``POST /v1/realtime/calls/{call_id}/hangup``.

OpenAI's WebRTC flow: the offer in (its SDP, or a form with the session
config beside it), ``201`` with the answer SDP and ``Location:
/v1/realtime/calls/{call_id}`` out, every candidate in the answer (no
trickle). The session opens before the answer is sent, so the config is in
force from the first event and a sideband socket may name the call at once
(``WS /v1/realtime?call_id=``). A refusal is an HTTP answer in OpenAI's
error shape, and no peer connection outlives it.

Admission is the WebSocket's: the same keys and client secrets, the same
per-key and per-address session caps and ``--max-sessions`` (a call is a
session); plus ``--max-calls-in-setup`` offers answered but not yet
connected, ``--rtc-max-offer-bytes`` a body, ``--rtc-connect-timeout-s``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

import msgspec
from aiortc.exceptions import InvalidAccessError, InvalidStateError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from duplex_server import metrics
from duplex_server.auth import Principal, authenticate, caller, denial
from duplex_server.http_body import BodyTooLarge
from duplex_server.http_errors import protocol_refusal
from duplex_server.realtime import Peer, RealtimeConnection
from duplex_server.sessions.core.records import WEBRTC_CARRIER, CallBody
from duplex_server.sessions.runtime.attachment import Attachment
from duplex_server.webrtc.call import RtcCall
from duplex_server.webrtc.offer import CallRequest, read_call_request
from protocol import client_events as ce
from protocol.dialect import negotiate
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate

log = logging.getLogger(__name__)

CALLS_PATH = "/v1/realtime/calls"
# Refusals that are not a 400, by code.
_STATUS = {
    "unauthorized": 401,
    "forbidden": 403,
    "invalid_resume_token": 403,
    "call_not_found": 404,
    "invalid_session_resume": 404,
    "session_resume_expired": 404,
    "payload_too_large": 413,
    "unsupported_content_type": 415,
    "resource_exhausted": 429,  # a key's or an address's quota
    "storage_unavailable": 503,
}


class LiveCalls:
    """The server's calls with a peer connection, by call id, and the offers
    being answered; how many are in setup follows from them."""

    def __init__(self) -> None:
        self.by_id: dict[str, RtcCall] = {}
        self.answering: set[RtcCall] = set()  # offers not yet answered
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_setup(self) -> int:
        """Offers being answered, and answered calls not yet connected (ICE
        and DTLS): what ``--max-calls-in-setup`` bounds."""
        waiting = sum(not call.connected.is_set() for call in self.by_id.values())
        return len(self.answering) + waiting

    def add(self, call: RtcCall, task: asyncio.Task[None]) -> None:
        previous = self.by_id.get(call.call_id)
        self.by_id[call.call_id] = call
        if previous is not None and previous is not call:
            previous.frames.end()  # a new offer took the call over
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, call: RtcCall) -> None:
        if self.by_id.get(call.call_id) is call:
            del self.by_id[call.call_id]

    async def close_all(self) -> None:
        """Shutdown: every peer connection closed (their sessions stay in the log)."""
        await asyncio.gather(*(call.close("server shutdown") for call in list(self.by_id.values())))


def _refused(err: ProtocolError, status: int | None = None) -> Response:
    metrics.RTC_CALLS.labels(err.code).inc()
    return protocol_refusal(status or _STATUS.get(err.code, 400), err)


async def create_call(request: Request) -> Response:
    state = request.app.state
    config = state.config
    principal, bound = authenticate(request)
    refused = denial(principal, "realtime")
    if refused is not None:
        status, err = refused
        return _refused(err, status)
    assert principal is not None  # denial() refuses a missing caller
    calls: LiveCalls = state.rtc_calls
    if calls.in_setup >= config.max_calls_in_setup or state.manager.at_capacity:
        why = "too many calls are connecting" if calls.in_setup else "the server is at capacity"
        return _refused(ProtocolError("resource_exhausted", f"{why}; retry later"), 503)
    try:
        asked = await read_call_request(request, config.rtc_max_offer_bytes)
    except BodyTooLarge:
        return _refused(ProtocolError("payload_too_large", "the offer is too large"))
    except ProtocolError as err:
        return _refused(err)
    call = RtcCall(_new_call_id(), state.rtc_network, calls.forget, config.max_frame_bytes)
    calls.answering.add(call)
    try:
        return await _answer(request, call, principal, bound, asked)
    finally:
        calls.answering.discard(call)


async def _answer(
    request: Request,
    call: RtcCall,
    principal: Principal,
    bound: SessionUpdate | None,
    asked: CallRequest,
) -> Response:
    config = request.app.state.config
    calls: LiveCalls = request.app.state.rtc_calls
    try:
        answer = await call.answer(asked.sdp)
    except (ValueError, InvalidAccessError, InvalidStateError) as exc:
        await call.close("the offer could not be answered")
        return _refused(ProtocolError("invalid_offer", f"the offer cannot be answered: {exc}"))
    connection = _connection(request, principal, bound, call)
    try:
        await _attach(connection, call, asked, request.query_params.get("model"))
    except ProtocolError as err:
        await call.close(f"no session: {err.code}")
        return _refused(err)
    task = asyncio.get_running_loop().create_task(
        call.run(connection, config.rtc_connect_timeout_s)
    )
    calls.add(call, task)
    metrics.RTC_CALLS.labels("resumed" if asked.resume else "answered").inc()
    location = f"{CALLS_PATH}/{call.call_id}"
    return Response(answer, 201, media_type="application/sdp", headers={"Location": location})


def _connection(
    request: Request, principal: Principal, bound: SessionUpdate | None, call: RtcCall
) -> RealtimeConnection:
    state = request.app.state
    client = request.client
    peer = Peer(
        principal,
        client.host if client else "",
        duplex=False,  # OpenAI's semantics: the data channel is OpenAI's endpoint
        bound=bound,
        call=CallBody(carrier=WEBRTC_CARRIER, call_id=call.call_id, stream_id=""),
    )
    dialect = negotiate(request.query_params.get("events"), request.headers.get("openai-beta"))
    attachment = Attachment(call.transport, dialect=dialect)
    return RealtimeConnection(
        call.frames, attachment, peer, state.manager, state.decoder, state.config
    )


async def _attach(
    connection: RealtimeConnection, call: RtcCall, asked: CallRequest, model: str | None
) -> None:
    """Open the call's session, or resume the one the offer names; the
    offer's own config follows a resume or a client secret's config."""
    if asked.resume is not None:
        actor = await connection.resume_session(asked.resume)
        if actor.state.call is not None:
            call.call_id = actor.state.call.call_id  # the call goes on under its id
    elif connection.bound is not None:
        actor = await connection.open_session(connection.bound)
    else:
        session = asked.session or SessionUpdate()
        if model and session.model is msgspec.UNSET:
            session = msgspec.structs.replace(session, model=model)
        await connection.open_session(session)
        return
    if asked.session is not None:
        actor.post_client(
            ce.SessionUpdateEvent(session=asked.session), connection.attachment.generation
        )


def _new_call_id() -> str:
    return "rtc_" + secrets.token_hex(12)


async def hang_up(request: Request) -> Response:
    """End the call: its session closes (``session.closed``), then its peer
    connection. A call whose peer connection is gone but whose session
    waits for a new offer is ended too."""
    state = request.app.state
    principal = caller(request)
    refused = denial(principal, "realtime")
    if refused is not None:
        return protocol_refusal(*refused)
    assert principal is not None
    call_id = request.path_params["call_id"]
    actor = state.manager.actor_for_call(call_id)
    if actor is None or actor.state.call is None or actor.state.call.carrier != WEBRTC_CARRIER:
        return _refused(
            ProtocolError("call_not_found", f"no live call {call_id[:64]!r}", param="call_id")
        )
    if not principal.owns(actor.state.owner):
        return _refused(ProtocolError("forbidden", "this call was opened with another key"))
    call = state.rtc_calls.by_id.get(actor.state.call.call_id)
    if call is not None and not call.ended:
        call.hang_up()
    else:
        actor.end("client_close")
    return JSONResponse({}, 200)
