"""What the server itself brings to a session, and the records each writes.

A client's events are stepped by ``core/commands/``; these inputs come from
the server's side of the session: its opening, a restore after a crash, a
resume and a detach of the socket, the end the server decides (expiry,
shutdown), a suspend for a restart, and the heal after a storage outage.
The runtime brings the facts only it has (the lease's owner and fence, a
fresh resume token, how long the process was down) and performs the I/O;
what goes into the log is decided here, on a :class:`Batch`.
"""

from __future__ import annotations

from dataclasses import dataclass

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.config import with_default_turn_detection
from duplex_server.sessions.core.records import (
    CallBody,
    CloseBody,
    CloseReason,
    ConfigBody,
    LeaseAction,
    LeaseBody,
)
from duplex_server.sessions.core.responses import cancel_response, finish_response
from duplex_server.sessions.core.snapshot import session_object
from duplex_server.sessions.core.state import SessionState
from duplex_server.sessions.core.token_hashes import hash_token, token_matches
from protocol.client_events import SessionResume
from protocol.errors import ProtocolError, error_body
from protocol.server_events import (
    Error,
    SessionClosed,
    SessionExpired,
    SessionUpdated,
)
from protocol.session_config import SessionUpdate


@dataclass(frozen=True)
class LeaseHolder:
    """Who writes the session now: this process's owner name and fence."""

    owner: str
    fence: int


def lease_fact(
    batch: Batch,
    holder: LeaseHolder,
    action: LeaseAction,
    generation: int,
    token: str | None = None,
) -> None:
    """Record an attachment change; only the token's hash enters the log."""
    batch.fact(
        LeaseBody(
            action=action,
            owner=holder.owner,
            fence=holder.fence,
            generation=generation,
            token_hash=hash_token(token) if token is not None else None,
        ),
        origin="manager",
    )


def record_opening(
    batch: Batch,
    holder: LeaseHolder,
    patch: SessionUpdate,
    token: str | None,
    *,
    handshake: bool,
    openai_semantics: bool,
    owner: str | None,
    turn_detection_types: tuple[str, ...],
    call: CallBody | None = None,
) -> None:
    """The first socket attaches with the opening config (its turn
    detection defaulted as the model's kind wants); a handshake client is
    told the config it got. A phone call's ids and numbers come first."""
    if call is not None:
        batch.fact(call)
    lease_fact(batch, holder, "attach", 1, token)
    opening = with_default_turn_detection(patch, turn_detection_types)
    batch.fact(ConfigBody(patch=opening, openai_semantics=openai_semantics, owner=owner))
    if handshake:
        batch.emit(SessionUpdated(session=session_object(batch.state, batch.capabilities)))


def record_restore(batch: Batch, holder: LeaseHolder, *, expired: bool) -> bool:
    """A dead process's session, taken over: the answer that was in flight
    ends incomplete (``server_restart``), the socket it had is gone; the
    session expires now when its grace ran out while nobody served it, and
    a phone call ends now whatever the grace (a carrier never streams a call
    to a restarted server again; a WebRTC call waits for its new offer).
    True when the session ended here."""
    if batch.state.response is not None:
        finish_response(batch, "incomplete", "server_restart")
    generation = batch.state.lease.generation
    lease_fact(batch, holder, "takeover", generation)
    lease_fact(batch, holder, "detach", generation)
    if batch.state.call is not None and not batch.state.call.resumable:
        gone = "the call's media stream ended with the server"
        batch.fact(CloseBody(reason="disconnect", detail=gone), origin="manager")
        return True
    if expired:
        batch.emit(SessionExpired(reason="disconnect_grace_expired"))
        batch.fact(CloseBody(reason="disconnect_grace_expired"), origin="manager")
    return expired


def token_refusal(state: SessionState, request: SessionResume) -> ProtocolError | None:
    """``invalid_resume_token`` when ``request``'s token is not the session's
    (compared in constant time, against its hash); None when it is."""
    if token_matches(request.resume_token, state.lease.token_hash):
        return None
    return ProtocolError(
        "invalid_resume_token",
        "resume_token does not match this session",
        param="resume_token",
        event_id=request.event_id,
    )


def resume_refusal(state: SessionState, request: SessionResume) -> ProtocolError | None:
    """Why ``request`` may not resume this session: a token that is not the
    session's, or a cursor beyond what was ever sent. None: it may."""
    if (wrong_token := token_refusal(state, request)) is not None:
        return wrong_token
    cursor = request.last_received_server_event_seq
    if cursor > state.server_event_seq:
        return ProtocolError(
            "invalid_session_resume",
            f"last_received_server_event_seq {cursor} is beyond the journal "
            f"(last sent {state.server_event_seq})",
            param="last_received_server_event_seq",
            event_id=request.event_id,
        )
    return None


def record_resume(batch: Batch, holder: LeaseHolder, token: str) -> int:
    """A new socket takes the session over; returns its generation."""
    generation = batch.state.lease.generation + 1
    lease_fact(batch, holder, "resume", generation, token)
    return generation


def record_detach(batch: Batch, holder: LeaseHolder) -> None:
    """The socket went away (or was closed for a restart); the session waits."""
    lease_fact(batch, holder, "detach", batch.state.lease.generation)


def record_end(batch: Batch, reason: CloseReason) -> str | None:
    """The server ends the session (expiry, shutdown): the client is told
    why, an answer still going ends incomplete. Returns that answer's id,
    for the runtime to stop its stream once the close landed."""
    state = batch.state
    aborted = cancel_response(batch, "session_ended", "incomplete") if state.response else None
    if reason in ("disconnect_grace_expired", "idle_ttl_expired"):
        batch.emit(SessionExpired(reason=reason))
    else:
        # the remaining close reasons are all SessionClosed's
        batch.emit(SessionClosed(reason=reason, session_id=state.session_id))  # type: ignore[arg-type]
    batch.fact(CloseBody(reason=reason), origin="manager")
    return aborted


def record_outage_stop(batch: Batch) -> None:
    """After a storage outage: the answer whose output could not be
    recorded was stopped; the client hears why and it ends failed."""
    if batch.state.response is None:
        return
    stopped = ProtocolError(
        "storage_unavailable", "the response was stopped: its output could not be recorded"
    )
    batch.emit(Error(error=error_body(stopped)))
    finish_response(batch, "failed", "storage_unavailable")
