"""The one way anything changes a session: a command through ``step``.

A command is a client's event (``core/commands/``) or what the server
decided from what it heard (``core/heard.py``). Either goes the same way:
``admit`` runs the guards (a retry, a capability gate) once, then ``apply``
runs handler(batch, command, facts[, prepared]) -> a batch of records (each
applied to the state as it is added) and the events they journal, plus the
effects (``core/effects.py``) the runtime performs once the batch is in the
log. Every handler knows the model (``ModelFacts``); only a commit is given
what recognition heard (``HeardTurn``) and only an append what the runtime
prepared for it (``PreparedAppend``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgspec

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import (
    CLIENT_HANDLERS,
    Handler,
    HeardTurn,
    ModelFacts,
    Prepared,
    PreparedAppend,
    audio_append,
    audio_commit,
)
from duplex_server.sessions.core.effects import Effects
from duplex_server.sessions.core.gates import refuse_gated
from duplex_server.sessions.core.heard import HEARD_HANDLERS, HeardCommand, TurnEnded, turn_ended
from duplex_server.sessions.core.state import SessionState
from protocol import client_events as ce
from protocol.capabilities import Capabilities
from protocol.errors import ProtocolError

Command = ce.ClientEvent | HeardCommand

HANDLERS: dict[type, Handler] = {**CLIENT_HANDLERS, **HEARD_HANDLERS}


@dataclass(frozen=True)
class Admitted:
    """A command the guards let through, with its client event's digest (for
    the window of recent ids). Only :func:`admit` makes one, so only an
    admitted command is applied, and the guards never run twice."""

    command: Command
    digest: str | None


def admit(
    state: SessionState, command: Command, capabilities: Capabilities
) -> Admitted | ProtocolError:
    """The guards, run once before anything is prepared or recorded: a
    retried event (``refuse_retry``) and one the model's capabilities gate
    (``core/gates.py``) are refused here. The runtime asks this before it
    prepares the command, so a refused commit is not transcribed."""
    digest = None
    if isinstance(command, ce.ClientEvent) and command.event_id is not None:
        digest = event_digest(command)
        if (refusal := refuse_retry(state, command, digest)) is not None:
            return refusal
    if (refusal := refuse_gated(state, command, capabilities)) is not None:
        return refusal
    return Admitted(command, digest)


def apply(
    state: SessionState,
    admitted: Admitted,
    facts: ModelFacts,
    now_ms: int,
    prepared: Prepared | None = None,
) -> tuple[Batch, Effects]:
    """The admitted command's handler: the records it adds (each already
    applied to ``state``), the events they journal, and what the runtime
    must do outside the log. ``prepared``: what the runtime worked out for
    this command first (``runtime/input_preparation.py``). Raises
    :class:`ProtocolError` for input the handler refuses (records added
    before the refusal are the caller's to discard: refold)."""
    command = admitted.command
    event_id = command.event_id if isinstance(command, ce.ClientEvent) else None
    batch = Batch(state, facts.model.capabilities, now_ms, event_id, admitted.digest)
    effects = _handle(batch, command, facts, prepared)
    batch.settle()
    return batch, effects


def _handle(
    batch: Batch, command: Command, facts: ModelFacts, prepared: Prepared | None
) -> Effects:
    """The command's handler, given what was prepared for it; a preparation
    meant for another command is a bug in the runtime, never skipped."""
    match command, prepared:
        case ce.InputAudioAppend(), PreparedAppend():
            return audio_append(batch, command, facts, prepared)
        case ce.InputAudioCommit(), HeardTurn():
            return audio_commit(batch, command, facts, prepared)
        case TurnEnded(), HeardTurn():
            return turn_ended(batch, command, facts, prepared)
        case _, None:
            return HANDLERS[type(command)](batch, command, facts)
    raise TypeError(f"{type(prepared).__name__} was prepared for a {type(command).__name__}")


def step(
    state: SessionState,
    command: Command,
    facts: ModelFacts,
    now_ms: int,
    prepared: Prepared | None = None,
) -> tuple[Batch, Effects]:
    """The pure session step, :func:`apply` after :func:`admit` (a refusal of
    either raises :class:`ProtocolError`). Tests and benches call this; the
    actor calls the two halves, preparing the command between them."""
    admitted = admit(state, command, facts.model.capabilities)
    if isinstance(admitted, ProtocolError):
        raise admitted
    return apply(state, admitted, facts, now_ms, prepared)


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
