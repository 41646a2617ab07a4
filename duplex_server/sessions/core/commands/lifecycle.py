"""The session's own lifecycle as the client drives it: acknowledging server
events (the journal may be trimmed up to them) and closing the session. A resume
and a heartbeat are answered by the socket's attachment, never stepped
(``SOCKET_EVENTS`` in ``__init__``)."""

from __future__ import annotations

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands.given import ModelFacts
from duplex_server.sessions.core.commands.shared import _stopping
from duplex_server.sessions.core.effects import Close, Effects, Trim
from duplex_server.sessions.core.records import AckBody, CloseBody
from duplex_server.sessions.core.responses import cancel_response
from protocol import client_events as ce
from protocol.errors import ProtocolError
from protocol.server_events import SessionClosed


def event_ack(batch: Batch, event: ce.SessionEventAck, facts: ModelFacts) -> Effects:
    if event.server_event_seq > batch.state.server_event_seq:
        raise ProtocolError(
            "invalid_event",
            f"server_event_seq {event.server_event_seq} was never sent "
            f"(last is {batch.state.server_event_seq})",
            param="server_event_seq",
            event_id=event.event_id,
        )
    batch.fact(AckBody(what="event", server_event_seq=event.server_event_seq))
    return (Trim(event.server_event_seq),)


def session_close(batch: Batch, event: ce.SessionClose, facts: ModelFacts) -> Effects:
    aborted = cancel_response(batch, "client_cancelled") if batch.state.response else None
    batch.emit(
        SessionClosed(reason="client_close", detail=event.reason, session_id=batch.state.session_id)
    )
    batch.fact(CloseBody(reason="client_close", detail=event.reason))
    return (*_stopping(aborted), Close())
