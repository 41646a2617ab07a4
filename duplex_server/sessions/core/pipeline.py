"""The one way anything changes a session: a command through ``step``.

A command is a client's event (``core/commands.py``) or what the server
decided from what it heard (``core/heard.py``). Either goes the same way:
handler(state, command, context) -> a batch of records (each applied to the
state as it is added) and the events they journal, plus the effects the
runtime applies once the batch is in the log.
"""

from __future__ import annotations

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import CLIENT_HANDLERS, Effects, Handler, HandlerContext
from duplex_server.sessions.core.heard import HEARD_HANDLERS, HeardCommand
from duplex_server.sessions.core.state import SessionState
from protocol import client_events as ce

Command = ce.ClientEvent | HeardCommand

HANDLERS: dict[type, Handler] = {**CLIENT_HANDLERS, **HEARD_HANDLERS}


def step(
    state: SessionState, command: Command, ctx: HandlerContext, now_ms: int
) -> tuple[Batch, Effects]:
    """The pure session step: one command -> the records it adds (each
    already applied to ``state``), the events they journal, and what the
    runtime must do outside the log. Raises :class:`ProtocolError` for input
    that is refused (records added before the refusal are the caller's to
    discard: refold). Tests and benches call this, as the actor does."""
    event_id = command.event_id if isinstance(command, ce.ClientEvent) else None
    batch = Batch(state, ctx.model.capabilities, now_ms, event_id)
    return batch, HANDLERS[type(command)](batch, command, ctx)
