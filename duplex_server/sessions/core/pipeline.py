"""The one way anything changes a session: a command through ``step``.

A command is a client's event (``core/commands.py``) or what the server
decided from what it heard (``core/heard.py``). Either goes the same way:
handler(state, command, context) -> a batch of records (each applied to the
state as it is added) and the events they journal, plus the effects the
runtime applies once the batch is in the log.
"""

from __future__ import annotations

import hashlib

import msgspec

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import CLIENT_HANDLERS, Handler, HandlerContext
from duplex_server.sessions.core.effects import Effects
from duplex_server.sessions.core.gates import refuse_gated
from duplex_server.sessions.core.heard import HEARD_HANDLERS, HeardCommand
from duplex_server.sessions.core.state import SessionState
from protocol import client_events as ce
from protocol.errors import ProtocolError

Command = ce.ClientEvent | HeardCommand

HANDLERS: dict[type, Handler] = {**CLIENT_HANDLERS, **HEARD_HANDLERS}


def step(
    state: SessionState, command: Command, ctx: HandlerContext, now_ms: int
) -> tuple[Batch, Effects]:
    """The pure session step: one command -> the records it adds (each
    already applied to ``state``), the events they journal, and what the
    runtime must do outside the log. Raises :class:`ProtocolError` for input
    that is refused (records added before the refusal are the caller's to
    discard: refold); a retried event, or one the model's capabilities gate
    (``core/gates.py``), is refused before any record. Tests and benches
    call this, as the actor does."""
    event_id = command.event_id if isinstance(command, ce.ClientEvent) else None
    digest = None
    if event_id is not None:
        digest = event_digest(command)
        if (refusal := refuse_retry(state, command, digest)) is not None:
            raise refusal
    if (refusal := refuse_gated(state, command, ctx.model.capabilities)) is not None:
        raise refusal
    batch = Batch(state, ctx.model.capabilities, now_ms, event_id, digest)
    effects = HANDLERS[type(command)](batch, command, ctx)
    batch.settle()
    return batch, effects


def event_digest(event: msgspec.Struct) -> str:
    """What a client event says, in 16 hex digits: its canonical JSON (the
    decoded struct, so key order and spacing do not matter), hashed."""
    return hashlib.blake2b(msgspec.json.encode(event), digest_size=8).hexdigest()


def refuse_retry(
    state: SessionState, command: Command, digest: str | None = None
) -> ProtocolError | None:
    """A client event whose ``event_id`` the session applied recently is
    never applied again, and never met with silence (a client waiting for
    its answer would wait for ever): the same body is a retry
    (``duplicate_event``: its outputs are in the journal already), a
    different one reuses the id (``event_id_reused``: nothing is applied).
    Either names the seq of the record the id landed as."""
    event_id = command.event_id if isinstance(command, ce.ClientEvent) else None
    if event_id is None or (landed := state.recent_event_ids.get(event_id)) is None:
        return None
    seq, original = landed
    if original is not None and original != (digest or event_digest(command)):
        return ProtocolError(
            "event_id_reused",
            f"event_id {event_id!r} was used by a different event (log seq {seq}); "
            "this one is not applied: give each event its own id",
            param="event_id",
            event_id=event_id,
        )
    return duplicate_event(event_id, seq)


def duplicate_event(event_id: str, seq: int | None) -> ProtocolError:
    where = f" as log seq {seq}" if seq is not None else ""
    return ProtocolError(
        "duplicate_event",
        f"event_id {event_id!r} was applied before{where}; the retry is not applied again "
        "(its outputs are in the journal)",
        param="event_id",
        event_id=event_id,
    )
