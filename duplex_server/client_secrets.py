"""``POST /v1/realtime/client_secrets``: a short-lived key for a browser.

A page should never hold the server's real key (a WebSocket subprotocol is
visible to every proxy and devtools panel). Its backend, or the page itself
after asking its user once, trades the key for an ephemeral one: valid for
``expires_after.seconds`` (10 to 7200, default 600), usable once to open one
session as the same principal, with the session config given here checked
now and applied when the session opens. The shape is OpenAI's.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from duplex_server.auth import caller, denial
from duplex_server.http_errors import protocol_refusal
from protocol.codec import drop_optional_nulls
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate

MAX_BODY_BYTES = 64 * 1024


class ExpiresAfter(msgspec.Struct):
    anchor: Literal["created_at"] = "created_at"
    seconds: Annotated[int, msgspec.Meta(ge=10, le=7200)] = 600


class ClientSecretRequest(msgspec.Struct):
    expires_after: ExpiresAfter = msgspec.field(default_factory=ExpiresAfter)
    session: SessionUpdate | None = None


async def client_secrets(request: Request) -> Response:
    principal = caller(request)
    refused = denial(principal, "realtime")
    if refused is not None:
        return protocol_refusal(*refused)
    assert principal is not None  # denial() refuses a missing caller
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        return protocol_refusal(
            413, ProtocolError("payload_too_large", "the request body is too large")
        )
    try:
        asked = _decode(body)
        if asked.session is not None:
            request.app.state.manager.check_opening_patch(asked.session)
        key, grant = request.app.state.ephemeral.mint(
            principal, asked.expires_after.seconds, asked.session
        )
    except ProtocolError as err:
        return protocol_refusal(429 if err.code == "resource_exhausted" else 400, err)
    session = msgspec.to_builtins(asked.session) if asked.session is not None else {}
    return JSONResponse({"value": key, "expires_at": int(grant.expires_at), "session": session})


def _decode(body: bytes) -> ClientSecretRequest:
    try:
        raw = msgspec.json.decode(body) if body.strip() else {}
        return msgspec.convert(drop_optional_nulls(raw, ClientSecretRequest), ClientSecretRequest)
    except msgspec.DecodeError as exc:
        raise ProtocolError("invalid_json", f"the body is not valid JSON: {exc}") from None
    except msgspec.ValidationError as exc:
        raise ProtocolError("invalid_value", str(exc)) from None
