"""Helpers more than one topic module uses: a voice check, the epoch and
multi-spelling checks, audio decoding, the next user item's id, and starting or
stopping an answer (a commit may start one, a close or a cancel stops one). Here
so that the topic modules never import each other."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from duplex_server.audio import AudioDecodeError, decode_to_pcm16
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.config import transcribes_only
from duplex_server.sessions.core.effects import Effects, StartAnswer, StopAnswer
from duplex_server.sessions.core.model_port import ModelPort, history_view, session_view
from duplex_server.sessions.core.responses import cancel_response, listen, start_response
from duplex_server.sessions.core.state import SessionState
from protocol import client_events as ce
from protocol.audio_formats import AudioFormat
from protocol.errors import ProtocolError


def check_voice(voice: object, param: str, model: ModelPort, event_id: str | None) -> None:
    """An unknown voice is refused when it is named, never at answer time."""
    if isinstance(voice, str) and not model.accepts_voice(voice):
        raise ProtocolError(
            "invalid_value",
            f"voice {voice!r} is unknown to model {model.name!r}",
            param=param,
            event_id=event_id,
        )


def _check_epoch(state: SessionState, event: ce.ClientEvent) -> None:
    if event.epoch is not None and event.epoch < state.epoch:
        raise ProtocolError(
            "stale_epoch",
            f"event is for epoch {event.epoch}, the session is at epoch {state.epoch}",
            param="epoch",
            event_id=event.event_id,
        )


_T = TypeVar("_T")


def _asked(event: ce.ClientEvent, read: Callable[[], _T]) -> _T:
    """A field the client may spell several ways; spellings that contradict
    each other are refused under the event's id."""
    try:
        return read()
    except ProtocolError as err:
        err.event_id = event.event_id
        raise


def decode_audio(data: bytes, fmt: AudioFormat, event_id: str | None, param: str) -> bytes:
    try:
        return decode_to_pcm16(data, fmt)
    except AudioDecodeError as exc:
        raise ProtocolError("invalid_audio", str(exc), param=param, event_id=event_id) from None


def next_user_item_id(state: SessionState) -> str:
    return f"item_{state.session_id[-10:]}_u{state.item_count + 1}"


def _maybe_respond(batch: Batch, model: ModelPort) -> Effects:
    """The model's turn decision after new input: speak (superseding) or
    listen; neither in a transcription session (nothing answers there)."""
    state = batch.state
    if transcribes_only(state.config):
        return ()
    answering = model.answering  # None: a native duplex model takes the floor itself
    if (
        answering is None
        or state.listen_count < state.config.force_listen_count
        or not answering.wants_to_speak(history_view(state.items), session_view(state.config))
    ):
        listen(batch, "model_listening")
        return ()
    return _supersede_and_start(batch, None)


def _supersede_and_start(
    batch: Batch, overrides: ce.ResponseOverrides | None, requested: bool = False
) -> Effects:
    """Start a response, cancelling the active one (``new_response``) first."""
    aborted = cancel_response(batch, "new_response") if batch.state.response is not None else None
    stopping = _stopping(aborted)
    return (*stopping, StartAnswer(start_response(batch, overrides, requested=requested)))


def _stopping(aborted: str | None) -> Effects:
    """Stopping the answer a cancel fenced off (None: it had no stream)."""
    return (StopAnswer(aborted),) if aborted else ()


def start_answer(batch: Batch) -> Effects:
    """Start an answer now (the server's own reason: an idle timeout); none
    in a transcription session."""
    if transcribes_only(batch.state.config):
        return ()
    return _supersede_and_start(batch, None)
