"""What every model adapter does to hand a response to its engine."""

from __future__ import annotations

from typing import TypeVar

from duplex_server.engine import EngineRequest
from duplex_server.sessions.core.model_port import ResponseRequest

P = TypeVar("P")


def for_response(request: ResponseRequest, payload: P) -> EngineRequest[P]:
    """An engine request for a session's response: one request per response,
    tagged with its epoch so output of a fenced-off epoch is dropped."""
    return EngineRequest(
        request_id=request.response_id,
        session_id=request.session_id,
        response_id=request.response_id,
        epoch=request.epoch,
        payload=payload,
    )
