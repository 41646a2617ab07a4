"""Plain HTTP routes: health, models, and read access to session logs."""

from __future__ import annotations

from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)

from duplex_server.auth import is_authorized
from duplex_server.redaction import redact
from duplex_server.sessions.core.records import to_line
from duplex_server.sessions.core.snapshot import session_object
from duplex_server.sessions.log.store import UnknownSession

_encoder = msgspec.json.Encoder()
MAX_SEQ = 2**63  # record seqs are signed 64-bit in every store
WEB_DIR = Path(__file__).parent / "web"


def _json(payload: object, status: int = 200) -> Response:
    return Response(_encoder.encode(payload), status_code=status, media_type="application/json")


def _error(status: int, code: str, message: str) -> Response:
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    return JSONResponse({"error": {"type": kind, "code": code, "message": message}}, status)


def _unauthorized(request: Request) -> Response | None:
    if is_authorized(request, request.app.state.config.api_key):
        return None
    return _error(401, "unauthorized", "missing or wrong API key")


async def voice_page(request: Request) -> Response:
    """The browser voice page (plain HTML and JS; no build step)."""
    return FileResponse(WEB_DIR / "index.html", media_type="text/html")


async def health(request: Request) -> Response:
    """``degraded`` (still HTTP 200: the process serves) while the store does
    not answer. Anyone may ask whether the server lives; the details (the
    store, with any password redacted, the replica, the load) are for
    callers with the key when the server has one."""
    state = request.app.state
    store_ok = await state.log.ping()
    status: dict[str, object] = {"status": "ok" if store_ok else "degraded"}
    if _unauthorized(request) is None:
        status |= {
            "store_reachable": store_ok,
            "sessions": len(state.manager.actors),
            "model": state.model.name,
            "store": redact(state.config.store),
            "replica_id": state.config.replica_id,
        }
    return _json(status)


async def models(request: Request) -> Response:
    model = request.app.state.model
    return _json(
        {
            "object": "list",
            "data": [
                {
                    "id": model.name,
                    "object": "model",
                    "owned_by": "duplex-server",
                    "capabilities": model.capabilities,
                }
            ],
        }
    )


async def metrics(request: Request) -> Response:
    if (denied := _unauthorized(request)) is not None:
        return denied
    state = request.app.state
    return PlainTextResponse(
        state.metrics.render(len(state.manager.actors)), media_type="text/plain; version=0.0.4"
    )


async def session_detail(request: Request) -> Response:
    if (denied := _unauthorized(request)) is not None:
        return denied
    session_id = request.path_params["session_id"]
    manager = request.app.state.manager
    actor = manager.actors.get(session_id)
    if actor is None:
        ended = manager.ended_reason(session_id)
        if ended is None:
            return _error(404, "session_not_found", f"no session {session_id}")
        return _json({"id": session_id, "state": "closed", "reason": ended})
    return _json(session_object(actor.state, actor.model.capabilities))


async def session_events(request: Request) -> Response:
    """The session's log as JSON lines (``?after=SEQ`` to page)."""
    if (denied := _unauthorized(request)) is not None:
        return denied
    session_id = request.path_params["session_id"]
    try:
        after = int(request.query_params.get("after", "0"))
    except ValueError:
        return _error(400, "invalid_request", "after must be an integer")
    if not 0 <= after < MAX_SEQ:
        return _error(400, "invalid_request", f"after must be between 0 and {MAX_SEQ - 1}")
    try:
        records = await request.app.state.log.read(session_id, after)
    except UnknownSession:
        return _error(404, "session_not_found", f"no session {session_id}")

    async def lines():
        for record in records:
            yield _encoder.encode(to_line(record)) + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
