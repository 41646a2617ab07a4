"""One way every HTTP route (and every refused WebSocket upgrade) says no:
OpenAI's error shape, ``{"error": {"type", "code", "message", "param"}}``,
with ``Retry-After`` on a ``429`` or ``503`` so a client knows when to come
back. Before, five routes each built the envelope themselves, and none sent
``Retry-After``.
"""

from __future__ import annotations

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.errors import (
    AUTHENTICATION,
    ERROR_CLASS,
    INVALID_REQUEST,
    RATE_LIMIT,
    SERVER_ERROR,
    ErrorBody,
    ProtocolError,
    error_body,
)

# Seconds a refused client waits before trying again (a capacity or rate
# refusal clears within about a second: a session closes, a bucket refills).
RETRY_AFTER_S = 1
RETRIED = (429, 503)


def error_class(status: int, code: str) -> str:
    """The error's ``type``: the code's own where the wire defines it, else by status."""
    if code in ERROR_CLASS:
        return ERROR_CLASS[code]
    if status in (401, 403):
        return AUTHENTICATION
    if status == 429:
        return RATE_LIMIT
    return SERVER_ERROR if status >= 500 else INVALID_REQUEST


def refusal(
    status: int,
    code: str,
    message: str,
    *,
    param: str | None = None,
    retry_after_s: int = RETRY_AFTER_S,
) -> JSONResponse:
    body = ErrorBody(type=error_class(status, code), code=code, message=message, param=param)
    return _response(status, body, retry_after_s)


def protocol_refusal(status: int, err: ProtocolError) -> JSONResponse:
    """A :class:`ProtocolError` as an HTTP answer (its class and param kept)."""
    return _response(status, error_body(err), RETRY_AFTER_S)


# Starlette's own refusals (a path no route serves, a method its route lacks,
# a form its parser cannot read) get the shape every other refusal has.
STARLETTE_CODES = {400: "invalid_request_body", 404: "not_found", 405: "method_not_allowed"}


async def starlette_refusal(request: Request, exc: Exception) -> Response:
    """The app's handler of Starlette's ``HTTPException``: its status and
    headers (``Allow`` on a 405) kept, its plain text made OpenAI's shape."""
    assert isinstance(exc, HTTPException)  # registered for HTTPException only
    answer = refusal(
        exc.status_code, STARLETTE_CODES.get(exc.status_code, "invalid_request"), exc.detail
    )
    answer.headers.update(exc.headers or {})
    return answer


def _response(status: int, body: ErrorBody, retry_after_s: int) -> JSONResponse:
    headers = {"Retry-After": str(retry_after_s)} if status in RETRIED else None
    return JSONResponse({"error": msgspec.to_builtins(body)}, status, headers=headers)
