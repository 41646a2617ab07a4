"""The model's side of a session: what it is asked for, what its output
writes into the session, and when that output writes nothing.

The model's feed (``runtime/*_feed.py``) posts these inputs to the session's
mailbox; each is stepped here into records on a :class:`Batch` like a
client's command. Output of an epoch fenced since (a cancel, a barge-in) or
of a response that is no longer the session's is dropped unseen: stale
output never reaches the log. Nothing is recorded once the session closed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.config import response_config, response_output_format
from duplex_server.sessions.core.model_port import (
    ResponseRequest,
    StreamSetup,
    UnitOutput,
    history_view,
    session_view,
    stream_setup,
)
from duplex_server.sessions.core.records import UnitBody
from duplex_server.sessions.core.responses import finish_response, project_unit_outputs
from duplex_server.sessions.core.state import Response, SessionState
from protocol.audio_formats import AudioFormat
from protocol.errors import ProtocolError, error_body
from protocol.server_events import Error

# The session's audio encoder for a response's output format (None: pcm16).
StreamEncoder = Callable[[str], Callable[[bytes, int], bytes] | None]


@dataclass
class Chunks:
    """A turn model's output is waiting: the runtime takes every chunk pending
    for the response at once (chunks produced while it was busy share one batch)."""

    response_id: str
    epoch: int


@dataclass
class StreamEnd:
    response_id: str
    epoch: int
    error: str | None
    # The model's stage times that came after its last output (reported on
    # the response's done events, so they are journaled with it).
    stage_ms: dict[str, float] | None = None


@dataclass
class UnitOutputs:
    """A native duplex model's decisions and output for the units it just
    stepped, under the epoch they were stepped in, and the unit itself with
    the model's tokens (``unit``: logged whatever the epoch, since the
    model's state moved on either way)."""

    outputs: list[UnitOutput]
    epoch: int
    unit: UnitBody | None = None


@dataclass
class ModelFailed:
    """A native duplex model's step raised: it says nothing more this session."""

    error: str
    epoch: int


def primed_setup(state: SessionState) -> StreamSetup | None:
    """What a primed native model hears first: the session's setup, once it
    has input (None before)."""
    return stream_setup(state.config) if state.input_started else None


def answer_request(state: SessionState, response: Response) -> ResponseRequest:
    """What the model is asked for when the session opens ``response``: the
    history as it stands and the config the response runs under."""
    return ResponseRequest(
        session_id=state.session_id,
        response_id=response.id,
        epoch=response.epoch,
        modalities=list(response.modalities),
        history=history_view(state.items),
        config=session_view(response_config(state.config, response.overrides)),
    )


def output_format(state: SessionState, response_id: str) -> AudioFormat:
    """The audio format ``response_id`` speaks in: its own, else the session's."""
    response = state.find_response(response_id)
    overrides = response.overrides if response is not None else None
    return response_output_format(overrides, state.config.output_format)


def is_current(state: SessionState, response_id: str, epoch: int) -> bool:
    """Whether output for ``response_id`` under ``epoch`` is the session's answer now."""
    active = state.response
    return active is not None and active.id == response_id and epoch == state.epoch


def record_unit_outputs(batch: Batch, message: UnitOutputs, encoder: StreamEncoder) -> None:
    """The unit is logged whatever the epoch (a restore must rebuild the
    model as it is); what it decided only under the current epoch."""
    if batch.state.closed_reason is not None:
        return
    if message.unit is not None:
        batch.fact(message.unit, origin="engine")
    if message.epoch == batch.state.epoch:
        project_unit_outputs(batch, message.outputs, encoder)


def record_answer_output(
    batch: Batch, message: Chunks, outputs: list[UnitOutput], encoder: StreamEncoder
) -> None:
    """A turn model's chunks for the response the session opened."""
    if outputs and is_current(batch.state, message.response_id, message.epoch):
        project_unit_outputs(batch, outputs, encoder)


def record_stream_end(batch: Batch, message: StreamEnd) -> bool:
    """The answer's stream ended, well or not; False when it was no longer
    the session's answer (nothing recorded)."""
    if not is_current(batch.state, message.response_id, message.epoch):
        return False
    if message.error is not None:
        _engine_error(batch, message.error)
        finish_response(batch, "failed", "engine_error", message.stage_ms)
    else:
        finish_response(batch, "completed", stage_ms=message.stage_ms)
    return True


def record_model_failure(batch: Batch, message: ModelFailed) -> None:
    """The client hears why, and an answer it was giving ends failed."""
    if batch.state.closed_reason is not None:
        return
    _engine_error(batch, message.error)
    if batch.state.response is not None:
        finish_response(batch, "failed", "engine_error")


def _engine_error(batch: Batch, error: str) -> None:
    batch.emit(Error(error=error_body(ProtocolError("engine_error", error))))
