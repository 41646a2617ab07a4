"""response.create and response.cancel: what a create may ask for, when a create
folds into the auto-response already answering the same input, and answering a
turn deferred while the assistant spoke (``respond_to_input``, from hearing)."""

from __future__ import annotations

from msgspec import UNSET

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands.given import ModelFacts
from duplex_server.sessions.core.commands.shared import (
    _maybe_respond,
    _stopping,
    _supersede_and_start,
    check_voice,
)
from duplex_server.sessions.core.config import (
    EffectiveConfig,
    check_response_tool_choice,
    response_output_format,
    transcribes_only,
)
from duplex_server.sessions.core.effects import Effects
from duplex_server.sessions.core.items import Item
from duplex_server.sessions.core.model_port import ModelPort
from duplex_server.sessions.core.records import SignalBody
from duplex_server.sessions.core.responses import cancel_response
from duplex_server.sessions.core.state import Response, SessionState
from protocol import client_events as ce
from protocol.errors import ProtocolError


def check_response_overrides(
    overrides: ce.ResponseOverrides,
    model: ModelPort,
    config: EffectiveConfig,
    event_id: str | None,
) -> None:
    """What a response.create may ask for: a voice the model speaks, a format
    the server encodes, a tool it offers, the conversation it belongs to
    (never out of band)."""
    check_voice(overrides.voice_named(), "response.voice", model, event_id)
    if overrides.conversation not in (UNSET, "auto"):
        raise ProtocolError(
            "invalid_value",
            "out-of-band responses are not supported: conversation must be 'auto'",
            param="response.conversation",
            event_id=event_id,
        )
    if overrides.input is not UNSET:
        raise ProtocolError(
            "invalid_value",
            "response.input is not supported: a response answers the conversation",
            param="response.input",
            event_id=event_id,
        )
    try:
        response_output_format(overrides, config.output_format)
        check_response_tool_choice(config, overrides)
    except ProtocolError as err:
        err.event_id = event_id
        raise


# Fields of response.create that tag a request rather than shape its answer:
# they never make it a different response from the one already coming.
_NOT_OVERRIDES = frozenset({"metadata", "conversation"})


def _has_overrides(overrides: ce.ResponseOverrides | None) -> bool:
    return overrides is not None and any(
        getattr(overrides, name) is not UNSET
        for name in overrides.__struct_fields__
        if name not in _NOT_OVERRIDES
    )


def _is_input(item: Item) -> bool:
    """What a response answers: a user turn or a tool's result."""
    return item.role == "user" or item.type == "function_call_output"


def _after_latest_input(state: SessionState, response: Response) -> bool:
    """Whether ``response`` was started after the newest input: it answers it."""
    index = next((i for i, it in enumerate(state.items) if it.id == response.item_id), None)
    return index is not None and not any(_is_input(it) for it in state.items[index + 1 :])


def _auto_answer_to_fold_into(
    state: SessionState, overrides: ce.ResponseOverrides | None
) -> Response | None:
    """The auto-response a plain response.create belongs to: the one that
    answers the same input and that no response.create claimed yet, while it
    streams (its metadata is echoed then) or once completed when the create
    asks for nothing of its own (no metadata to echo). A cancelled or failed
    answer is never one: the create is a retry."""
    wants_echo = overrides is not None and overrides.metadata is not UNSET
    for response in (state.response, state.last_response):
        if response is None or response.requested or not _after_latest_input(state, response):
            continue
        if response.status == "in_progress" or (response.status == "completed" and not wants_echo):
            return response
    return None


def latest_input_answered(state: SessionState) -> bool:
    """Whether some response (any status) was started after the newest input."""
    return any(
        response is not None and _after_latest_input(state, response)
        for response in (state.response, state.last_response)
    )


def response_create(batch: Batch, event: ce.ResponseCreate, facts: ModelFacts) -> Effects:
    model = facts.model
    state = batch.state
    if transcribes_only(state.config):
        raise ProtocolError(
            "unsupported_for_session_type",
            "a transcription session creates no responses: it hears and transcribes "
            "(open a session of type 'realtime' for answers)",
            param="type",
            event_id=event.event_id,
        )
    if event.response is not None:
        check_response_overrides(event.response, model, state.config, event.event_id)
    has_input = any(_is_input(it) for it in state.items)
    if not has_input and not state.config.openai_semantics:
        raise ProtocolError(
            "response_create_without_input",
            "response.create needs committed input: commit audio or create a user item first",
            param="type",
            event_id=event.event_id,
        )
    # The duplex wire folds a create into the auto-response answering the same
    # input; on the OpenAI endpoint a create is always its own response.
    folded = (
        None if state.config.openai_semantics else _auto_answer_to_fold_into(state, event.response)
    )
    if has_input and folded is not None and not _has_overrides(event.response):
        # One user turn, one answer: a duplex client's commit + response.create
        # yields the auto-response only. A second response.create for the
        # same input is a new request and gets a new answer.
        batch.fact(
            SignalBody(signal="response.create", overrides=event.response, response_id=folded.id)
        )
        return ()
    batch.fact(SignalBody(signal="response.create", overrides=event.response))
    return _supersede_and_start(batch, event.response, requested=True)


def _response_existed(state: SessionState, response_id: str) -> bool:
    """Whether this session ever had ``response_id`` (ids are numbered in
    order: ``responses.start_response``)."""
    prefix = f"resp_{state.session_id[-10:]}_"
    number = response_id.removeprefix(prefix)
    return (
        response_id.startswith(prefix) and number.isdigit() and int(number) <= state.response_count
    )


def response_cancel(batch: Batch, event: ce.ResponseCancel, facts: ModelFacts) -> Effects:
    """Cancel the active response. Nothing to cancel is OpenAI's
    ``response_cancel_not_active`` (clients treat it as harmless); a named
    response that never existed is ``response_not_found``."""
    state = batch.state
    active = state.response
    named = event.response_id
    if named is not None and (active is None or named != active.id):
        if not _response_existed(state, named):
            raise ProtocolError(
                "response_not_found",
                f"no response {named!r} in this session",
                param="response_id",
                event_id=event.event_id,
            )
        active = None
    if active is None:
        which = f"response {named!r} is" if named else "no response is"
        raise ProtocolError(
            "response_cancel_not_active",
            f"{which} in progress: nothing to cancel",
            param="response_id" if named else "type",
            event_id=event.event_id,
        )
    batch.fact(SignalBody(signal="response.cancel", response_id=active.id))
    aborted = cancel_response(batch, "client_cancelled")
    return _stopping(aborted)


def respond_to_input(batch: Batch, model: ModelPort) -> Effects:
    """Answer input committed earlier (a turn deferred while the assistant
    spoke), unless a response.create answered it meanwhile."""
    if latest_input_answered(batch.state):
        return ()
    return _maybe_respond(batch, model)
