"""Which events a session sends: OpenAI's types only on the OpenAI endpoint.

PROTOCOL.md: on the plain ``/v1/realtime`` (no ``?duplex=1``) the server
sends only the event types OpenAI defines, unless the session opts in to the
extensions (``extra_body.duplex_events``). A stock client (the Agents SDK,
Pipecat) turns every type it does not know into an error of its own, so an
unasked-for ``response.speak`` is a fault there, not a hint. Events that
answer an extension the client itself sent (``session.heartbeat_ack``,
``playback.acknowledged``, the ``session.closed`` of its ``session.close``,
the resume family) still go: only a client that speaks the extension asks.

Decided here, as the batch is built, so the journal holds what the socket
was sent and a replay sends the same.
"""

from __future__ import annotations

from protocol.errors import ProtocolError, error_body
from protocol.server_events import (
    Error,
    OverlapDecision,
    ResponseListen,
    ResponseSpeak,
    ServerEvent,
    SessionClosed,
    SessionExpired,
    TurnEvent,
)

# Told without being asked: the duplex wire's own news.
UNASKED_EXTENSIONS = (ResponseSpeak, ResponseListen, TurnEvent, OverlapDecision)


def as_sent(event: ServerEvent, extensions: bool) -> ServerEvent | None:
    """``event`` as a session that does (or does not) take extensions is
    sent it; None: not at all. An expiry becomes OpenAI's own
    ``session_expired`` error; a close the client did not ask for has no
    OpenAI event (the socket's close says it)."""
    if extensions:
        return event
    if isinstance(event, UNASKED_EXTENSIONS):
        return None
    if isinstance(event, SessionExpired):
        expired = ProtocolError("session_expired", f"the session expired ({event.reason})")
        return Error(error=error_body(expired))
    if isinstance(event, SessionClosed) and event.reason != "client_close":
        return None
    return event
