"""Plain HTTP routes: health, readiness, models, and read access to session logs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    Response,
    StreamingResponse,
)

from duplex_server import metrics as series
from duplex_server.auth import Principal, caller, denial
from duplex_server.http_errors import refusal
from duplex_server.redaction import redact
from duplex_server.sessions.core.records import ConfigBody, to_line
from duplex_server.sessions.core.snapshot import session_object
from duplex_server.sessions.log.store import UnknownSession

_encoder = msgspec.json.Encoder()
MAX_SEQ = 2**63  # record seqs are signed 64-bit in every store
WEB_DIR = Path(__file__).parent / "web"


def _json(payload: object, status: int = 200) -> Response:
    return Response(_encoder.encode(payload), status_code=status, media_type="application/json")


def _error(status: int, code: str, message: str) -> Response:
    return refusal(status, code, message)


def _principal(request: Request, scope: str | None = None) -> Principal | Response:
    """The caller, or the response that refuses it: 401 for a missing or
    wrong key, 403 for a key without ``scope``."""
    principal = caller(request)
    refused = denial(principal, scope)
    if refused is not None:
        status, err = refused
        return _error(status, err.code, err.message)
    assert principal is not None  # denial() refuses a missing caller
    return principal


def _not_yours(principal: Principal, owner: str | None) -> Response | None:
    if principal.owns(owner):
        return None
    return _error(403, "forbidden", "this session was opened with another key")


def _owner(records: list) -> str | None:
    opening = next((r.body for r in records if isinstance(r.body, ConfigBody)), None)
    return opening.owner if opening is not None else None


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
    principal = caller(request)
    if principal is not None and principal.may("admin"):
        status |= {
            "store_reachable": store_ok,
            "sessions": len(state.manager.actors),
            "model": state.model.name,
            "store": redact(state.config.store),
            "replica_id": state.config.replica_id,
        }
    return _json(status)


async def version(request: Request) -> Response:
    """The server's version and Python (as ``duplex_build_info``): anyone may ask."""
    return _json(series.build())


async def ready(request: Request) -> Response:
    """Readiness, for load balancers: 503 naming the reasons while this
    replica cannot open a session (its store does not answer, its model is
    not loaded, admission is full), so it is drained until it can; 200
    otherwise. ``/health`` stays a liveness check. Anyone may ask."""
    reasons = await request.app.state.manager.unready()
    if reasons:
        return _json({"status": "unready", "reasons": reasons}, 503)
    return _json({"status": "ready", "reasons": []})


async def models(request: Request) -> Response:
    """The served model under each name it answers to: the served names, then
    OpenAI's realtime names it takes as aliases (``root`` names the model
    behind each, as vLLM's list does; an alias's ``parent`` is the served
    name it stands for, a served name's is null, so a picker lists those).
    A served name's ``aliases`` are the alias entries that stand for it.
    Each entry is an ``openai.types.Model`` (``id``, ``object``, ``created``,
    ``owned_by``) with those extras."""
    model = request.app.state.model
    names = request.app.state.model_names
    served = set(names.served)
    return _json(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "duplex-server",
                    "root": model.name,
                    "parent": None if name in served else names.default,
                    "aliases": list(names.aliases) if name == names.default else [],
                    "capabilities": model.capabilities,
                }
                for name in names.listed()
            ],
        }
    )


async def metrics(request: Request) -> Response:
    if isinstance(denied := _principal(request, "admin"), Response):
        return denied
    registry = request.app.state.metrics
    # Rendering walks every series: off the event loop, like any unbounded work.
    body = await asyncio.to_thread(series.render, registry)
    return Response(body, media_type=series.CONTENT_TYPE)


async def session_detail(request: Request) -> Response:
    """A live session's object, or how an ended one ended: its owner's (or an admin's)."""
    if isinstance(principal := _principal(request), Response):
        return principal
    session_id = request.path_params["session_id"]
    manager = request.app.state.manager
    actor = manager.actors.get(session_id)
    if actor is None:
        ended = manager.ended_reason(session_id)
        if ended is None:
            return _error(404, "session_not_found", f"no session {session_id}")
        try:
            owner = _owner(await request.app.state.log.read(session_id))
        except UnknownSession:
            owner = None  # purged: only how it ended is left
        if (refused := _not_yours(principal, owner)) is not None:
            return refused
        return _json({"id": session_id, "state": "closed", "reason": ended})
    if (refused := _not_yours(principal, actor.state.owner)) is not None:
        return refused
    return _json(session_object(actor.state, actor.model.capabilities))


async def session_events(request: Request) -> Response:
    """The session's log as JSON lines (``?after=SEQ`` to page): its owner's
    (or an admin's)."""
    if isinstance(principal := _principal(request), Response):
        return principal
    session_id = request.path_params["session_id"]
    try:
        after = int(request.query_params.get("after", "0"))
    except ValueError:
        return _error(400, "invalid_request", "after must be an integer")
    if not 0 <= after < MAX_SEQ:
        return _error(400, "invalid_request", f"after must be between 0 and {MAX_SEQ - 1}")
    log = request.app.state.log
    try:
        # Read whole once: the owner is in its opening records, the page after them.
        records = await log.read(session_id)
    except UnknownSession:
        return _error(404, "session_not_found", f"no session {session_id}")
    if (refused := _not_yours(principal, _owner(records))) is not None:
        return refused

    async def lines():
        for record in records:
            if record.seq > after:
                yield _encoder.encode(to_line(record)) + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
