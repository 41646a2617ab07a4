"""session.update: the checks a patch to the session's config must pass (also
run by the runtime on the opening patch) and the handler that applies it."""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands.given import ModelFacts
from duplex_server.sessions.core.commands.shared import check_voice
from duplex_server.sessions.core.config import merge_config
from duplex_server.sessions.core.effects import Effects
from duplex_server.sessions.core.gates import immutable_refusals, model_update
from duplex_server.sessions.core.model_port import Listening, ModelPort
from duplex_server.sessions.core.records import ConfigBody
from duplex_server.sessions.core.snapshot import session_object, transcription_session_object
from duplex_server.sessions.core.state import SessionState
from protocol import client_events as ce
from protocol.errors import ProtocolError, error_body
from protocol.server_events import Error, SessionUpdated, TranscriptionSessionUpdated
from protocol.session_config import InputTranscription, SessionUpdate


def check_session_patch(patch: SessionUpdate, model: ModelPort, event_id: str | None) -> None:
    """What a session.update (or the opening patch) may not do, beyond the
    config merge's own checks: name a voice the model cannot speak, give
    instructions it cannot take, or ask its recogniser for a language or a
    prompt it cannot take."""
    check_voice(patch.voice, "session.voice", model, event_id)
    if isinstance(patch.instructions, str) and (
        why := model.instructions_refusal(patch.instructions)
    ):
        raise ProtocolError("invalid_value", why, param="session.instructions", event_id=event_id)
    if patch.audio is not UNSET and patch.audio.output is not UNSET:
        check_voice(patch.audio.output.voice, "session.audio.output.voice", model, event_id)
    param = "session.input_audio_transcription"
    transcription = patch.input_audio_transcription
    if patch.audio is not UNSET and patch.audio.input is not UNSET and transcription is UNSET:
        param, transcription = "session.audio.input.transcription", patch.audio.input.transcription
    if isinstance(transcription, InputTranscription) and model.listening is not None:
        check_transcription(transcription, param, model.listening, event_id)


def check_transcription(
    settings: InputTranscription, param: str, listening: Listening, event_id: str | None
) -> None:
    def refuse(field: str, why: str) -> ProtocolError:
        return ProtocolError("invalid_value", why, param=f"{param}.{field}", event_id=event_id)

    if isinstance(settings.delay, str):
        raise refuse(
            "delay",
            "the server's recogniser takes no delay: its transcripts come as it hears "
            "(partial transcripts while the user speaks, the whole one at the turn's end)",
        )
    languages = listening.transcription_languages
    named = [settings.language] if isinstance(settings.language, str) else []
    if isinstance(settings.languages, list):
        if len(settings.languages) > 1 and languages is not None and len(languages) == 1:
            raise refuse("languages", f"the recogniser hears only {next(iter(languages))!r}")
        named += settings.languages
    for index, language in enumerate(named):
        if language and languages is not None and language.lower() not in languages:
            field = "language" if index == 0 and isinstance(settings.language, str) else "languages"
            raise refuse(
                field,
                f"language {language!r} is not one the recogniser hears: "
                + ", ".join(sorted(languages)),
            )
    for field in ("prompt", "keywords"):  # UNSET is falsy, as is an empty one
        if getattr(settings, field) and not listening.transcription_prompts:
            why = f"the recogniser takes no {field} (Whisper recognisers do: --asr whisper-ct2)"
            raise refuse(field, why)


def _type_refusal(
    state: SessionState,
    patch: SessionUpdate,
    event_id: str | None,
    refusals: list[ProtocolError],
) -> tuple[SessionUpdate, list[ProtocolError]]:
    """A session's type may change only while it has heard and said nothing
    (a socket opened at connect takes its first update's type, as a session
    OpenAI opens for it would); later a change is refused alone."""
    if not isinstance(patch.type, str) or patch.type == state.config.session_type:
        return patch, refusals
    pristine = not (state.input_started or state.items or state.response_count)
    if pristine:
        return patch, refusals
    refusal = ProtocolError(
        "session_type_update_unsupported",
        f"this session is of type {state.config.session_type!r} and has begun: its type "
        "cannot change (open a new session); the rest of the update was applied",
        param="session.type",
        event_id=event_id,
    )
    return msgspec.structs.replace(patch, type=UNSET), [*refusals, refusal]


def session_update(batch: Batch, event: ce.SessionUpdateEvent, facts: ModelFacts) -> Effects:
    """Apply an update; a field the model fixed at open that it would change
    is refused on its own (an ``error`` naming it, before ``session.updated``)
    and the rest applies. A name the model answers to is no change."""
    model = facts.model
    state = batch.state
    event = msgspec.structs.replace(event, session=model_update(event.session, facts.model_names))
    patch, refusals = immutable_refusals(state, event, model.capabilities)
    patch, refusals = _type_refusal(state, patch, event.event_id, refusals)
    try:
        merge_config(state.config, patch, model.turn_detection_types)
    except ProtocolError as err:
        err.event_id = event.event_id
        raise
    check_session_patch(patch, model, event.event_id)
    batch.fact(ConfigBody(patch=patch))
    for refusal in refusals:
        batch.emit(Error(error=error_body(refusal)))
    if isinstance(event, ce.TranscriptionSessionUpdate):
        batch.emit(TranscriptionSessionUpdated(session=transcription_session_object(state)))
    else:
        batch.emit(SessionUpdated(session=session_object(state, batch.capabilities)))
    return ()
