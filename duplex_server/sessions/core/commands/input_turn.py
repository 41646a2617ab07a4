"""What ends, drops or adds to the user's turn: commit (the buffer becomes a user
item, and perhaps an answer starts), clear, cancel, native text input, and the
server VAD's speech decisions that hearing records (``core/heard.py``)."""

from __future__ import annotations

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands.given import NOTHING_HEARD, HeardTurn, ModelFacts
from duplex_server.sessions.core.commands.shared import (
    _asked,
    _check_epoch,
    _maybe_respond,
    next_user_item_id,
)
from duplex_server.sessions.core.config import (
    auto_responds,
    tells_transcripts,
    transcribes_only,
    transcript_deltas_add_up,
)
from duplex_server.sessions.core.effects import Effects, KeepTurn
from duplex_server.sessions.core.items import to_wire
from duplex_server.sessions.core.records import (
    CommitBody,
    DecisionAction,
    DecisionBody,
    SignalBody,
    TextBody,
)
from duplex_server.sessions.core.responses import advance_epoch, emit_twins, listen
from duplex_server.sessions.core.turns import Transition
from protocol import client_events as ce
from protocol.errors import ProtocolError, error_body
from protocol.server_events import (
    Error,
    InputCleared,
    InputCommitted,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    ItemAdded,
    ItemDone,
    NativeCommit,
    SpeechStarted,
    SpeechStopped,
    TranscriptionUsage,
)


def speech_transition(batch: Batch, transition: Transition) -> None:
    """Record a server VAD decision and tell the client, naming the item the
    speech will be committed as."""
    item_id = next_user_item_id(batch.state)
    action: DecisionAction = (
        "speech_started" if transition.kind == "speech_started" else "speech_stopped"
    )
    batch.fact(
        DecisionBody(action=action, audio_ms=transition.at_ms, item_id=item_id), origin="server"
    )
    if transition.kind == "speech_started":
        batch.emit(SpeechStarted(audio_start_ms=round(transition.at_ms), item_id=item_id))
    else:
        batch.emit(SpeechStopped(audio_end_ms=round(transition.at_ms), item_id=item_id))


def tell_transcription_error(batch: Batch, heard: HeardTurn) -> None:
    """Recognition failed on the buffer being committed: the client hears
    why before the commit (which goes ahead without a transcript)."""
    if heard.error is not None:
        batch.emit(Error(error=error_body(heard.error)))


def _turn_stages(heard: HeardTurn, vad_hangover_ms: float | None) -> dict[str, float]:
    stages = {"vad_hangover_ms": vad_hangover_ms, "asr_final_ms": heard.wait_ms}
    return {name: round(ms, 3) for name, ms in stages.items() if ms is not None}


def audio_commit(
    batch: Batch,
    event: ce.InputAudioCommit,
    facts: ModelFacts,
    heard: HeardTurn = NOTHING_HEARD,
    *,
    vad_hangover_ms: float | None = None,
) -> Effects:
    """Commit the input buffer as a user item; ``heard`` is what the model's
    speech recognition heard in it (the runtime runs it beforehand), and
    ``vad_hangover_ms`` the silence server VAD waited for before it ended
    the turn (a commit of the server's: ``core/heard.turn_ended``).
    Told in OpenAI's order: committed, the item, its transcript (the part the
    partial deltas did not tell yet as one last delta, so the deltas add up
    to the completed text), the item done."""
    state = batch.state
    _check_epoch(state, event)
    tell_transcription_error(batch, heard)
    if event.is_speech is False:
        batch.fact(CommitBody(item_id="", response_create=False, is_speech=False))
        listen(batch, "client_declared_silence")
        return ()
    if not state.input.chunks and not state.input.text:
        raise ProtocolError(
            "input_audio_buffer_empty",
            "nothing to commit: the input buffer is empty",
            param="type",
            event_id=event.event_id,
        )
    asked = _asked(event, event.respond_named)
    if asked and transcribes_only(state.config):
        raise ProtocolError(
            "unsupported_for_session_type",
            "a transcription session creates no responses: commit without response_create",
            param="response_create",
            event_id=event.event_id,
        )
    respond = asked if asked is not None else auto_responds(state.config)
    transcript = state.input.client_transcript or heard.text
    previous = state.items[-1].id if state.items else None
    item_id = next_user_item_id(state)
    pcm = b"".join(state.input.chunks)
    batch.fact(
        CommitBody(
            item_id=item_id,
            response_create=respond,
            final=bool(event.final),
            transcript=transcript,
            stage_ms=_turn_stages(heard, vad_hangover_ms),
        )
    )
    item = state.find_item(item_id)
    assert item is not None
    wire = to_wire(item)
    batch.emit(
        InputCommitted(
            item_id=item_id,
            previous_item_id=previous,
            event=NativeCommit(
                turn_id=state.turn_id,
                epoch=state.epoch,
                history_len=len(state.items),
                response_create_deferred=not respond,
                audio_ms=round(item.parts[0].audio_ms, 3),
                session_id=state.session_id,
                message="input committed",
            ),
        )
    )
    emit_twins(batch, ItemAdded(item=wire, previous_item_id=previous))
    recorded = item.parts[0].transcript
    if recorded and tells_transcripts(state.config):
        told = heard.told if recorded.startswith(heard.told) else ""
        rest = recorded[len(told) :]
        if rest and transcript_deltas_add_up(state.config):
            batch.emit(InputTranscriptionDelta(item_id=item_id, delta=rest))
        batch.emit(
            InputTranscriptionCompleted(
                item_id=item_id,
                transcript=recorded,
                usage=TranscriptionUsage(seconds=round(item.parts[0].audio_ms / 1000, 3)),
            )
        )
    batch.emit(ItemDone(item=wire, previous_item_id=previous))
    kept = (KeepTurn(item_id, pcm),) if pcm else ()
    return kept + (_maybe_respond(batch, facts.model) if respond else ())


def audio_clear(batch: Batch, event: ce.InputAudioClear, facts: ModelFacts) -> Effects:
    batch.fact(SignalBody(signal="input.clear"))
    batch.emit(InputCleared(epoch=batch.state.epoch))
    return ()


def input_cancel(batch: Batch, event: ce.InputCancel, facts: ModelFacts) -> Effects:
    batch.fact(SignalBody(signal="input.cancel"))
    advance_epoch(batch, "input_cancelled")
    batch.emit(InputCleared(epoch=batch.state.epoch))
    return ()


def text_append(batch: Batch, event: ce.InputTextAppend, facts: ModelFacts) -> Effects:
    model = facts.model
    if "text" not in model.capabilities.input_modes:
        raise ProtocolError(
            "native_text_append_unsupported",
            f"model {model.name!r} does not take text input",
            param="type",
            event_id=event.event_id,
        )
    _check_epoch(batch.state, event)
    batch.fact(TextBody(text=event.text))
    return ()
