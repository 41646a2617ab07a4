"""``WS /v1/telephony/twilio/stream``: the media stream Twilio opens for a call.

Refused before the upgrade, in OpenAI's error shape, when telephony is off
(no ``--twilio-auth-token``: 404), when the upgrade's ``X-Twilio-Signature``
does not verify (Twilio signs the ``wss://`` URL it was given: 403), and
while ``--max-calls-in-setup`` streams have connected without starting
(503): a socket that never sends ``start`` holds no session, but it holds a
slot until its start deadline (``--handshake-timeout-s``).
"""

from __future__ import annotations

import logging

from starlette.websockets import WebSocket

from duplex_server.http_errors import refusal
from duplex_server.telephony.call import PhoneCall
from duplex_server.telephony.twilio_dialect import TwilioDialect
from duplex_server.telephony.twilio_signature import verify_request

log = logging.getLogger(__name__)

_DIALECT = TwilioDialect()


async def twilio_stream(websocket: WebSocket) -> None:
    state = websocket.app.state
    config = state.config
    token = config.twilio_auth_token
    if token is None:
        await _deny(websocket, 404, "telephony_not_configured", "telephony is off")
        return
    if not verify_request(websocket, {}, token):
        log.warning("twilio media stream: refused an upgrade whose signature does not verify")
        await _deny(websocket, 403, "invalid_signature", "X-Twilio-Signature does not verify")
        return
    if state.calls_in_setup >= config.max_calls_in_setup:
        await _deny(websocket, 503, "resource_exhausted", "too many calls are starting; retry")
        return
    await websocket.accept()
    state.calls_in_setup += 1
    in_setup = True

    def left_setup() -> None:
        nonlocal in_setup
        if in_setup:
            in_setup = False
            state.calls_in_setup -= 1

    call = PhoneCall(websocket, _DIALECT, state.manager, state.call_configs, left_setup)
    try:
        await call.run(config.handshake_timeout_s)
    finally:
        left_setup()


async def _deny(websocket: WebSocket, status: int, code: str, message: str) -> None:
    await websocket.send_denial_response(refusal(status, code, message))
