"""The ledger of tool calls: which ``function_call_output`` may answer which call.

A call is a ``function_call`` item in the conversation (the model's, or one a
client restored with ``conversation.item.create``). Its output is taken once,
and only while the call stands: a call whose response was cut off (a barge-in,
a cancel, a failure) is stale, because the model never finished the turn that
asked for it and will not be waiting for the answer. The ledger is the
conversation itself, folded from the log, so a resumed or restarted session
keeps it.
"""

from __future__ import annotations

from duplex_server.sessions.core.state import SessionState
from protocol.errors import ProtocolError


def check_function_call_output(state: SessionState, call_id: str, event_id: str | None) -> None:
    """Raise the refusal for an output that no standing, unanswered call awaits."""
    call = None
    for item in reversed(state.items):
        if item.call_id != call_id:
            continue
        if item.type == "function_call_output":
            raise ProtocolError(
                "duplicate_function_call_output",
                f"call {call_id!r} was answered already (item {item.id!r})",
                param="item.call_id",
                event_id=event_id,
            )
        if item.type == "function_call" and call is None:
            call = item
    if call is None:
        raise ProtocolError(
            "unknown_function_call",
            f"no function_call {call_id!r} in the conversation",
            param="item.call_id",
            event_id=event_id,
        )
    if call.status == "incomplete":
        raise ProtocolError(
            "stale_function_call_output",
            f"call {call_id!r} belongs to a response that was cut off; "
            "the model is not waiting for its output",
            param="item.call_id",
            event_id=event_id,
        )
