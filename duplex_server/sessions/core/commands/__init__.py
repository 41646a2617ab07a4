"""Client commands -> records, one handler per event type (run by ``core/pipeline.step``).

A handler first validates against the current state (raising
:class:`ProtocolError` before recording anything), then adds facts and
outbound events to the batch. What the actor must do outside the log
(start or stop an answer, keep a turn's audio, trim the journal, close) is
returned as typed values (``core/effects.py``), in the order they are done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from duplex_server.audio import AudioDecodeError, decode_to_pcm16, pcm16_duration_ms
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.config import (
    EffectiveConfig,
    auto_responds,
    check_response_tool_choice,
    merge_config,
    response_output_format,
    tells_transcripts,
)
from duplex_server.sessions.core.effects import (
    Close,
    Effects,
    KeepTurn,
    StartAnswer,
    StopAnswer,
    Trim,
)
from duplex_server.sessions.core.gates import immutable_refusals, model_update, refuse_gated
from duplex_server.sessions.core.items import Item, Part, item_text, to_wire
from duplex_server.sessions.core.model_names import ModelNames
from duplex_server.sessions.core.model_port import Listening, ModelPort, history_view, session_view
from duplex_server.sessions.core.records import (
    AckBody,
    AudioBody,
    CloseBody,
    CommitBody,
    ConfigBody,
    DecisionAction,
    DecisionBody,
    FenceReason,
    FrameBody,
    ItemBody,
    SignalBody,
    SignalName,
    TextBody,
)
from duplex_server.sessions.core.responses import (
    advance_epoch,
    cancel_response,
    emit_twins,
    listen,
    played_through,
    start_response,
)
from duplex_server.sessions.core.snapshot import ledger, session_object
from duplex_server.sessions.core.state import Response, SessionState
from duplex_server.sessions.core.tool_calls import check_function_call_output
from duplex_server.sessions.core.turns import OverlapAction, Transition
from protocol import client_events as ce
from protocol.audio_formats import OPUS, SUPPORTED_INPUT, AudioFormat, resolve_format
from protocol.codec import decode_base64, strip_data_url
from protocol.errors import ProtocolError, error_body
from protocol.items import ContentPart
from protocol.server_events import (
    Error,
    InputCleared,
    InputCommitted,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    ItemAdded,
    ItemDeleted,
    ItemDone,
    ItemRetrieved,
    ItemTruncated,
    NativeCommit,
    OutputAudioCleared,
    OutputAudioStarted,
    OutputAudioStopped,
    OverlapDecision,
    OverlapMetadata,
    PlaybackAcknowledged,
    PlaybackEvent,
    SessionClosed,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TranscriptionUsage,
)
from protocol.session_config import InputTranscription, SessionUpdate


@dataclass
class HandlerContext:
    """What a handler may use besides the state and the event: the model's
    facts, and what the runtime prepared for this one event (a commit: the
    transcript recognition heard in the buffer; an append: the session's
    decoder for codecs whose packets depend on the ones before, Opus)."""

    model: ModelPort
    # The names the model answers to (None: its own name, OpenAI's as aliases).
    names: ModelNames | None = None
    transcript: str = ""
    # The part of it the client was told already, as partial deltas (a
    # prefix: the runtime keeps what it told: hearing.Hearing.transcribe).
    transcript_told: str = ""
    # Recognition failed on the buffer: the commit goes ahead without a
    # transcript, and the client is told why first.
    transcription_error: ProtocolError | None = None
    # Stage times of the turn, ms: how long the commit waited for its final
    # transcript, and (server VAD) how much silence ended the speech.
    transcription_ms: float | None = None
    vad_hangover_ms: float | None = None
    decode_stream: Callable[[bytes], bytes] | None = None
    # Why the runtime cannot take more input now (its budget is spent, the
    # model is behind real time): the append is refused with this error.
    input_refused: ProtocolError | None = None
    # A large append's pcm16, decoded by the runtime off the event loop (or
    # why it could not be); None: the handler decodes it.
    decoded: bytes | ProtocolError | None = None

    @property
    def model_names(self) -> ModelNames:
        return self.names or ModelNames.of(self.model.name)


# Each handler takes its own event type; the table is keyed by that type.
Handler = Callable[[Batch, Any, HandlerContext], Effects]


# --- session ----------------------------------------------------------------


def check_voice(voice: object, param: str, model: ModelPort, event_id: str | None) -> None:
    """An unknown voice is refused when it is named, never at answer time."""
    if isinstance(voice, str) and not model.accepts_voice(voice):
        raise ProtocolError(
            "invalid_value",
            f"voice {voice!r} is unknown to model {model.name!r}",
            param=param,
            event_id=event_id,
        )


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
    languages = listening.transcription_languages
    language = settings.language if isinstance(settings.language, str) else ""
    if language and languages is not None and language.lower() not in languages:
        raise ProtocolError(
            "invalid_value",
            f"language {language!r} is not one the recogniser hears: "
            + ", ".join(sorted(languages)),
            param=f"{param}.language",
            event_id=event_id,
        )
    if isinstance(settings.prompt, str) and settings.prompt and not listening.transcription_prompts:
        raise ProtocolError(
            "invalid_value",
            "the recogniser takes no prompt (Whisper recognisers do: --asr whisper-ct2)",
            param=f"{param}.prompt",
            event_id=event_id,
        )


def session_update(batch: Batch, event: ce.SessionUpdateEvent, ctx: HandlerContext) -> Effects:
    """Apply an update; a field the model fixed at open that it would change
    is refused on its own (an ``error`` naming it, before ``session.updated``)
    and the rest applies. A name the model answers to is no change."""
    model = ctx.model
    state = batch.state
    event = msgspec.structs.replace(event, session=model_update(event.session, ctx.model_names))
    patch, refusals = immutable_refusals(state, event, model.capabilities)
    try:
        merge_config(state.config, patch, model.turn_detection_types)
    except ProtocolError as err:
        err.event_id = event.event_id
        raise
    check_session_patch(patch, model, event.event_id)
    batch.fact(ConfigBody(patch=patch))
    for refusal in refusals:
        batch.emit(Error(error=error_body(refusal)))
    batch.emit(SessionUpdated(session=session_object(state, batch.capabilities)))
    return ()


def event_ack(batch: Batch, event: ce.SessionEventAck, ctx: HandlerContext) -> Effects:
    if event.server_event_seq > batch.state.server_event_seq:
        raise ProtocolError(
            "invalid_event",
            f"server_event_seq {event.server_event_seq} was never sent "
            f"(last is {batch.state.server_event_seq})",
            param="server_event_seq",
            event_id=event.event_id,
        )
    batch.fact(AckBody(what="event", server_event_seq=event.server_event_seq))
    return (Trim(event.server_event_seq),)


def session_close(batch: Batch, event: ce.SessionClose, ctx: HandlerContext) -> Effects:
    aborted = cancel_response(batch, "client_cancelled") if batch.state.response else None
    batch.emit(
        SessionClosed(reason="client_close", detail=event.reason, session_id=batch.state.session_id)
    )
    batch.fact(CloseBody(reason="client_close", detail=event.reason))
    return (*_stopping(aborted), Close())


# --- input ------------------------------------------------------------------


def _check_epoch(state: SessionState, event: ce.ClientEvent) -> None:
    if event.epoch is not None and event.epoch < state.epoch:
        raise ProtocolError(
            "stale_epoch",
            f"event is for epoch {event.epoch}, the session is at epoch {state.epoch}",
            param="epoch",
            event_id=event.event_id,
        )


def append_format(state: SessionState, event: ce.InputAudioAppend) -> AudioFormat:
    """The format an append's audio is in, after the checks that come before
    decoding it (its epoch, its format and rate)."""
    _check_epoch(state, event)
    return _input_format(state, event)


def decode_append(
    event: ce.InputAudioAppend, fmt: AudioFormat, stream_decoder: Callable[[bytes], bytes] | None
) -> bytes:
    """An append's audio as pcm16 (pure apart from ``stream_decoder``'s state:
    Opus packets depend on the ones before); ProtocolError if undecodable."""
    raw = decode_base64(event.audio, param="audio", event_id=event.event_id)
    if stream_decoder is not None and fmt.name == OPUS:
        try:
            return stream_decoder(raw)
        except ValueError as exc:  # the codec's error: an undecodable packet
            raise ProtocolError(
                "invalid_audio", str(exc), param="audio", event_id=event.event_id
            ) from None
    return decode_audio(raw, fmt, event.event_id, "audio")


def _input_format(state: SessionState, event: ce.InputAudioAppend) -> AudioFormat:
    try:
        spec, rate = event.format_named(), event.rate_named()
        if spec is None and rate is None:
            return state.config.input_format
        param = "format" if event.format is not None or spec is None else "input_audio_format"
        if spec is None:
            spec = state.config.input_format.name
        return resolve_format(spec, param=param, supported=SUPPORTED_INPUT, rate_hz=rate)
    except ProtocolError as err:
        err.event_id = event.event_id
        raise


_T = TypeVar("_T")


def _asked(event: ce.ClientEvent, read: Callable[[], _T]) -> _T:
    """A field the client may spell several ways; spellings that contradict
    each other are refused under the event's id."""
    try:
        return read()
    except ProtocolError as err:
        err.event_id = event.event_id
        raise


DECLARED_SLACK_MS = 1.0  # a client's rounding of a duration it declares
MAX_CLIENT_TRANSCRIPT_CHARS = 65_536  # per turn


def _declared_timing(
    state: SessionState, event: ce.InputAudioAppend, fmt: AudioFormat, duration_ms: float
) -> float | None:
    """The chunk's end on the input timeline, from what the client declared;
    a declared duration or start the audio contradicts is refused: the
    client reads its audio in another format or rate than it said, and a
    silently wrong rate corrupts the session."""
    declared = _asked(event, event.duration_named)
    if declared is not None and abs(declared - duration_ms) > DECLARED_SLACK_MS:
        raise ProtocolError(
            "invalid_audio",
            f"the audio is {duration_ms:.1f} ms as {fmt.name} at {fmt.sample_rate_hz} Hz, "
            f"but the event declares {declared} ms: check its format and sample rate",
            param="duration_ms" if event.duration_ms is not None else "audio_duration_ms",
            event_id=event.event_id,
        )
    end_ms = event.audio_end_ms
    if event.audio_start_ms is not None:
        derived = event.audio_start_ms + duration_ms
        if end_ms is not None and abs(end_ms - derived) > DECLARED_SLACK_MS:
            raise ProtocolError(
                "invalid_audio",
                f"audio_start_ms {event.audio_start_ms} plus the chunk's {duration_ms:.1f} ms "
                f"is not audio_end_ms {end_ms}",
                param="audio_start_ms",
                event_id=event.event_id,
            )
        end_ms = derived if end_ms is None else end_ms
    transcript = event.transcript or ""
    if len(state.input.client_transcript) + len(transcript) > MAX_CLIENT_TRANSCRIPT_CHARS:
        raise ProtocolError(
            "input_audio_buffer_full",
            f"one turn's transcripts hold at most {MAX_CLIENT_TRANSCRIPT_CHARS} characters",
            param="transcript",
            event_id=event.event_id,
        )
    return end_ms


def decode_audio(data: bytes, fmt: AudioFormat, event_id: str | None, param: str) -> bytes:
    try:
        return decode_to_pcm16(data, fmt)
    except AudioDecodeError as exc:
        raise ProtocolError("invalid_audio", str(exc), param=param, event_id=event_id) from None


def audio_append(batch: Batch, event: ce.InputAudioAppend, ctx: HandlerContext) -> Effects:
    """``ctx.decode_stream``: the session's decoder for codecs whose packets
    depend on the ones before (Opus); the runtime keeps it. ``ctx.decoded``:
    a large append the runtime already decoded off the event loop."""
    if ctx.input_refused is not None:
        ctx.input_refused.event_id = event.event_id
        raise ctx.input_refused
    state = batch.state
    fmt = append_format(state, event)
    if isinstance(ctx.decoded, ProtocolError):
        raise ctx.decoded
    pcm = ctx.decoded if ctx.decoded is not None else decode_append(event, fmt, ctx.decode_stream)
    duration_ms = pcm16_duration_ms(len(pcm), fmt.sample_rate_hz)
    if state.input.audio_ms + duration_ms > MAX_INPUT_MS:
        raise ProtocolError(
            "input_audio_buffer_full",
            f"the input buffer holds {state.input.audio_ms / 1000:.1f} s; one turn holds at "
            f"most {MAX_INPUT_MS / 60_000:.0f} min: commit or clear it first",
            param="audio",
            event_id=event.event_id,
        )
    if state.input.chunks and state.input.sample_rate_hz != fmt.sample_rate_hz:
        raise ProtocolError(
            "invalid_audio",
            f"sample rate changed from {state.input.sample_rate_hz} to {fmt.sample_rate_hz} Hz "
            "inside one utterance; commit or clear first",
            param="sample_rate_hz",
            event_id=event.event_id,
        )
    end_ms = _declared_timing(state, event, fmt, duration_ms)
    speech = _asked(event, event.speech_named)
    hint = _asked(event, event.hint_named)
    if hint == "barge_in" and not batch.capabilities.supports_barge_in:
        raise ProtocolError(
            "capability_unsupported",
            f"model {ctx.model.name!r} does not support barge_in",
            param="overlap_action" if event.overlap_action else "force_barge_in",
            event_id=event.event_id,
        )
    frames = _video_frames(event)
    batch.fact(
        AudioBody(
            pcm=pcm,
            sample_rate_hz=fmt.sample_rate_hz,
            source_format=fmt.name,
            duration_ms=duration_ms,
            audio_end_ms=end_ms,
            is_speech=speech,
            speech_probability=event.speech_probability,
            transcript=event.transcript or None,
            overlap_hint=hint,
        )
    )
    for data in frames:
        batch.fact(FrameBody(data=data, audio_ms=state.input.audio_ms))
    return ()


MAX_VIDEO_FRAMES = 8  # per append
MAX_VIDEO_FRAME_BYTES = 1024 * 1024  # decoded


def _video_frames(event: ce.InputAudioAppend) -> list[bytes]:
    if len(event.video_frames) > MAX_VIDEO_FRAMES:
        raise ProtocolError(
            "invalid_event",
            f"at most {MAX_VIDEO_FRAMES} video frames per append",
            param="video_frames",
            event_id=event.event_id,
        )
    frames = []
    for index, frame in enumerate(event.video_frames):
        param = f"video_frames.{index}"
        encoded = strip_data_url(frame)
        # Strict base64 decodes at ~200 MB/s here: a frame whose text alone
        # proves it too large is refused before paying for the decode.
        if len(encoded) // 4 * 3 - 2 > MAX_VIDEO_FRAME_BYTES:
            raise _frame_too_large(param, event.event_id)
        data = decode_base64(encoded, param=param, event_id=event.event_id)
        if len(data) > MAX_VIDEO_FRAME_BYTES:
            raise _frame_too_large(param, event.event_id)
        frames.append(data)
    return frames


def _frame_too_large(param: str, event_id: str | None) -> ProtocolError:
    return ProtocolError(
        "payload_too_large",
        f"a video frame is at most {MAX_VIDEO_FRAME_BYTES} bytes",
        param=param,
        event_id=event_id,
    )


# One uncommitted turn holds at most this much audio (a monologue is bounded;
# under server VAD silence between turns is trimmed, so only speech counts).
MAX_INPUT_MS = 10 * 60 * 1000.0


def next_user_item_id(state: SessionState) -> str:
    return f"item_{state.session_id[-10:]}_u{state.item_count + 1}"


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


def tell_transcription_error(batch: Batch, ctx: HandlerContext) -> None:
    """Recognition failed on the buffer being committed: the client hears
    why before the commit (which goes ahead without a transcript)."""
    if ctx.transcription_error is not None:
        batch.emit(Error(error=error_body(ctx.transcription_error)))


def _turn_stages(ctx: HandlerContext) -> dict[str, float]:
    stages = {"vad_hangover_ms": ctx.vad_hangover_ms, "asr_final_ms": ctx.transcription_ms}
    return {name: round(ms, 3) for name, ms in stages.items() if ms is not None}


def audio_commit(batch: Batch, event: ce.InputAudioCommit, ctx: HandlerContext) -> Effects:
    """Commit the input buffer as a user item; ``ctx.transcript`` is what the
    model's speech recognition heard in it (the runtime runs it beforehand).
    Told in OpenAI's order: committed, the item, its transcript (the part the
    partial deltas did not tell yet as one last delta, so the deltas add up
    to the completed text), the item done."""
    model, transcript = ctx.model, ctx.transcript
    state = batch.state
    _check_epoch(state, event)
    tell_transcription_error(batch, ctx)
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
    respond = asked if asked is not None else auto_responds(state.config)
    transcript = state.input.client_transcript or transcript
    previous = state.items[-1].id if state.items else None
    item_id = next_user_item_id(state)
    pcm = b"".join(state.input.chunks)
    batch.fact(
        CommitBody(
            item_id=item_id,
            response_create=respond,
            final=bool(event.final),
            transcript=transcript,
            stage_ms=_turn_stages(ctx),
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
    heard = item.parts[0].transcript
    if heard and tells_transcripts(state.config):
        told = ctx.transcript_told if heard.startswith(ctx.transcript_told) else ""
        rest = heard[len(told) :]
        if rest and state.config.openai_semantics:
            batch.emit(InputTranscriptionDelta(item_id=item_id, delta=rest))
        batch.emit(
            InputTranscriptionCompleted(
                item_id=item_id,
                transcript=heard,
                usage=TranscriptionUsage(seconds=round(item.parts[0].audio_ms / 1000, 3)),
            )
        )
    batch.emit(ItemDone(item=wire, previous_item_id=previous))
    kept = (KeepTurn(item_id, pcm),) if pcm else ()
    return kept + (_maybe_respond(batch, model) if respond else ())


def _maybe_respond(batch: Batch, model: ModelPort) -> Effects:
    """The model's turn decision after new input: speak (superseding) or listen."""
    state = batch.state
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
    """Start an answer now (the server's own reason: an idle timeout)."""
    return _supersede_and_start(batch, None)


def audio_clear(batch: Batch, event: ce.InputAudioClear, ctx: HandlerContext) -> Effects:
    batch.fact(SignalBody(signal="input.clear"))
    batch.emit(InputCleared(epoch=batch.state.epoch))
    return ()


def input_cancel(batch: Batch, event: ce.InputCancel, ctx: HandlerContext) -> Effects:
    batch.fact(SignalBody(signal="input.cancel"))
    advance_epoch(batch, "input_cancelled")
    batch.emit(InputCleared(epoch=batch.state.epoch))
    return ()


def text_append(batch: Batch, event: ce.InputTextAppend, ctx: HandlerContext) -> Effects:
    model = ctx.model
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


# --- conversation -----------------------------------------------------------


# What OpenAI's item models require beyond the type (checked on the way in,
# so the item the server echoes back validates).
_REQUIRED_ITEM_FIELDS = {
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
}


def _client_item(state: SessionState, event: ce.ItemCreate) -> tuple[Item, list[bytes]]:
    """The item to store, and the pcm16 of each of its parts (b"" for text)."""
    wire = event.item
    item_id = wire.id if isinstance(wire.id, str) and wire.id else next_user_item_id(state)
    if state.find_item(item_id) is not None:
        raise ProtocolError(
            "invalid_event",
            f"item {item_id!r} already exists",
            param="item.id",
            event_id=event.event_id,
        )
    for field_name in _REQUIRED_ITEM_FIELDS.get(wire.type, ()):
        if not isinstance(getattr(wire, field_name), str):
            raise ProtocolError(
                "invalid_event",
                f"a {wire.type} item needs {field_name}",
                param=f"item.{field_name}",
                event_id=event.event_id,
            )
    if wire.type == "function_call_output":
        check_function_call_output(state, wire.call_id, event.event_id)  # type: ignore[arg-type]  # a str, checked above
    if wire.type == "message" and wire.role is UNSET:
        raise ProtocolError(
            "invalid_event",
            "a message item needs a role",
            param="item.role",
            event_id=event.event_id,
        )
    _check_content_types(event)
    parts = []
    audio: list[bytes] = []
    for index, content in enumerate(wire.content):
        param = f"item.content.{index}.audio"
        if content.type in ("input_audio", "audio") and isinstance(content.audio, str):
            fmt = state.config.input_format
            pcm = decode_audio(
                decode_base64(content.audio, param=param, event_id=event.event_id),
                fmt,
                event.event_id,
                param,
            )
            audio.append(pcm)
            parts.append(
                Part(
                    type=content.type,
                    audio_rate=fmt.sample_rate_hz,
                    audio_ms=pcm16_duration_ms(len(pcm), fmt.sample_rate_hz),
                    transcript=content.transcript or None,
                )
            )
        elif content.type == "input_image":
            audio.append(b"")
            parts.append(_image_part(content, index, event.event_id))
        else:
            text = content.text if isinstance(content.text, str) else ""
            transcript = content.transcript if isinstance(content.transcript, str) else None
            audio.append(b"")
            parts.append(Part(type=content.type, text=text, transcript=transcript))
    item = Item(
        id=item_id,
        type=wire.type,
        role=wire.role if wire.role is not UNSET else None,
        parts=parts,
        call_id=_given(wire.call_id),
        name=_given(wire.name),
        arguments=_given(wire.arguments),
        output=_given(wire.output),
    )
    return item, audio


# The content each role's messages carry, in either dialect's spelling.
_CONTENT_TYPES = {
    "user": ("input_text", "input_audio", "input_image"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio", "text", "audio"),
}


def _check_content_types(event: ce.ItemCreate) -> None:
    """A message's parts must be what its role says (an assistant speaks
    output_text/output_audio, a user input_text/input_audio, a system
    input_text); other items carry no content parts."""
    wire = event.item
    role = wire.role if isinstance(wire.role, str) else ""
    allowed = _CONTENT_TYPES.get(role, ()) if wire.type == "message" else ()
    for index, content in enumerate(wire.content):
        if content.type not in allowed:
            where = f"a {wire.role} message" if wire.type == "message" else f"a {wire.type} item"
            raise ProtocolError(
                "invalid_event",
                f"{where} cannot carry {content.type!r} content"
                + (f"; it takes {', '.join(allowed)}" if allowed else ""),
                param=f"item.content.{index}.type",
                event_id=event.event_id,
            )


def _image_part(content: ContentPart, index: int, event_id: str | None) -> Part:
    """An image the user shows: kept with its URL (a data: URL is the image
    itself) for the model and for ``conversation.item.retrieve``."""
    if not isinstance(content.image_url, str) or not content.image_url:
        raise ProtocolError(
            "invalid_event",
            "an input_image part needs an image_url",
            param=f"item.content.{index}.image_url",
            event_id=event_id,
        )
    return Part(type="input_image", image_url=content.image_url, detail=_given(content.detail))


def _given(value: str | UnsetType) -> str | None:
    return value if isinstance(value, str) else None


def item_create(batch: Batch, event: ce.ItemCreate, ctx: HandlerContext) -> Effects:
    state = batch.state
    previous = event.previous_item_id
    if previous not in (None, "root") and state.find_item(previous) is None:
        raise ProtocolError(
            "item_not_found",
            f"previous_item_id {previous!r} does not exist",
            param="previous_item_id",
            event_id=event.event_id,
        )
    item, audio = _client_item(state, event)
    if previous is None and state.items:
        previous = state.items[-1].id
    batch.fact(
        ItemBody(
            op="create",
            item_id=item.id,
            item=item,
            previous_item_id=None if previous == "root" else previous,
            audio=audio,
        )
    )
    emit_twins(batch, ItemAdded(item=to_wire(item), previous_item_id=previous))
    batch.emit(ItemDone(item=to_wire(item), previous_item_id=previous))
    pcm = b"".join(audio)
    return (KeepTurn(item.id, pcm),) if pcm else ()


def _existing_item(state: SessionState, event: ce.ClientEvent, item_id: str) -> Item:
    item = state.find_item(item_id)
    if item is None:
        raise ProtocolError(
            "item_not_found",
            f"no item {item_id!r} in the conversation",
            param="item_id",
            event_id=event.event_id,
        )
    return item


def item_retrieve(batch: Batch, event: ce.ItemRetrieve, ctx: HandlerContext) -> Effects:
    item = _existing_item(batch.state, event, event.item_id)
    batch.emit(ItemRetrieved(item=to_wire(item)))
    return ()


def item_delete(batch: Batch, event: ce.ItemDelete, ctx: HandlerContext) -> Effects:
    _existing_item(batch.state, event, event.item_id)
    active = batch.state.response
    if active is not None and active.item_id == event.item_id:
        raise ProtocolError(
            "invalid_event",
            "the item of a response still streaming cannot be deleted: cancel it first",
            param="item_id",
            event_id=event.event_id,
        )
    batch.fact(ItemBody(op="delete", item_id=event.item_id))
    batch.emit(ItemDeleted(item_id=event.item_id))
    return ()


# Clients count whole milliseconds of what they played (Pipecat sends the
# rounded-up duration of a finished answer): that much past the end is the end.
TRUNCATE_SLACK_MS = 1.0


def item_truncate(batch: Batch, event: ce.ItemTruncate, ctx: HandlerContext) -> Effects:
    model = ctx.model
    item = _existing_item(batch.state, event, event.item_id)
    if not model.capabilities.supports_audio_truncate:
        raise ProtocolError(
            "capability_unsupported",
            "this model does not support truncation",
            param="type",
            event_id=event.event_id,
        )
    if (
        item.role != "assistant"
        or event.content_index >= len(item.parts)
        or (item.parts[event.content_index].type != "audio")
    ):
        raise ProtocolError(
            "invalid_event",
            "only assistant audio content can be truncated",
            param="content_index",
            event_id=event.event_id,
        )
    audio_ms = item.parts[event.content_index].audio_ms
    active = batch.state.response
    if active is not None and active.item_id == item.id:
        audio_ms = active.playback.generated_ms
    if event.audio_end_ms > audio_ms + TRUNCATE_SLACK_MS:
        raise ProtocolError(
            "invalid_event",
            f"audio_end_ms {event.audio_end_ms} is past the item's {audio_ms:.1f} ms of audio",
            param="audio_end_ms",
            event_id=event.event_id,
        )
    end_ms = min(event.audio_end_ms, audio_ms)
    batch.fact(
        ItemBody(
            op="truncate",
            item_id=item.id,
            content_index=event.content_index,
            audio_end_ms=end_ms,
        )
    )
    batch.emit(
        ItemTruncated(
            item_id=item.id,
            content_index=event.content_index,
            audio_end_ms=round(end_ms),
        )
    )
    return ()


# --- response ---------------------------------------------------------------


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


def response_create(batch: Batch, event: ce.ResponseCreate, ctx: HandlerContext) -> Effects:
    model = ctx.model
    state = batch.state
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


def response_cancel(batch: Batch, event: ce.ResponseCancel, ctx: HandlerContext) -> Effects:
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


def _stop_output(batch: Batch, signal: SignalName, reason: FenceReason) -> Effects:
    # OpenAI's event names a response: the one cut, else the last one played.
    cleared = batch.state.response or batch.state.last_response
    batch.fact(SignalBody(signal=signal))
    aborted = cancel_response(batch, reason)
    batch.emit(
        OutputAudioCleared(response_id=cleared.id if cleared else "", epoch=batch.state.epoch)
    )
    return _stopping(aborted)


def overlap_decision(
    batch: Batch, action: OverlapAction, overlap_ms: float, response_id: str | None
) -> Effects:
    """What speech over the assistant leads to, told to the client; a
    barge-in also stops the answer (kept in history as far as it was played)."""
    batch.emit(
        OverlapDecision(
            action=action,
            reason={
                "drop": "short_overlap",
                "listen": "listen_only",
                "barge_in": "speech_over_answer",
            }[action],
            response_id=response_id,
            metadata=OverlapMetadata(overlap_ms=round(overlap_ms, 3)),
            policy=batch.state.config.overlap_policy,
        )
    )
    if action == "barge_in":
        return _stop_output(batch, "barge_in", "barge_in")
    if action == "drop":
        batch.fact(SignalBody(signal="input.clear"))  # the remark is not a turn
        batch.emit(InputCleared(epoch=batch.state.epoch))
    return ()


def respond_to_input(batch: Batch, model: ModelPort) -> Effects:
    """Answer input committed earlier (a turn deferred while the assistant
    spoke), unless a response.create answered it meanwhile."""
    if latest_input_answered(batch.state):
        return ()
    return _maybe_respond(batch, model)


def output_clear(batch: Batch, event: ce.OutputAudioClear, ctx: HandlerContext) -> Effects:
    state = batch.state
    if event.response_id is not None and state.find_response(event.response_id) is None:
        raise ProtocolError(
            "response_not_found",
            f"no response {event.response_id!r} to clear",
            param="response_id",
            event_id=event.event_id,
        )
    return _stop_output(batch, "output_audio.clear", "output_cleared")


def turn_signal(batch: Batch, event: ce.TurnSignal, ctx: HandlerContext) -> Effects:
    """An external turn signal (a client-side VAD, a push-to-talk button, a
    supervisor): the event it names, with ``payload`` as that event's fields,
    applied as if the client had sent it."""
    if event.event == "barge_in":
        return barge_in(batch, event, ctx)
    fields = {**event.payload, "type": event.event, "event_id": event.event_id}
    try:
        signalled = msgspec.convert(fields, ce.CLIENT_EVENT_TYPES[event.event])
    except msgspec.ValidationError as exc:
        raise ProtocolError(
            "invalid_event",
            f"turn.signal {event.event}: {exc}",
            param=f"payload{_path_of(str(exc))}",
            event_id=event.event_id,
        ) from None
    # The event it carries needs what that event needs (a truncate, truncation).
    if (refusal := refuse_gated(batch.state, signalled, batch.capabilities)) is not None:
        raise refusal
    return CLIENT_HANDLERS[type(signalled)](batch, signalled, ctx)


def _path_of(message: str) -> str:
    """``.session.voice`` from msgspec's "... - at `$.session.voice`"."""
    _, _, where = message.partition("- at `$")
    return where.rstrip("`")


def barge_in(batch: Batch, event: ce.ClientEvent, ctx: HandlerContext) -> Effects:
    model = ctx.model
    if not model.capabilities.supports_barge_in:
        raise ProtocolError(
            "capability_unsupported",
            f"model {model.name!r} does not support barge_in",
            param="type",
            event_id=event.event_id,
        )
    return _stop_output(batch, "barge_in", "barge_in")


def playback_ack(batch: Batch, event: ce.PlaybackAck, ctx: HandlerContext) -> Effects:
    state = batch.state
    response = state.find_response(event.response_id)
    if response is None and event.item_id is not None:
        response = next(
            (
                r
                for r in (state.response, state.last_response)
                if r is not None and r.item_id == event.item_id
            ),
            None,
        )
    if response is None:
        raise ProtocolError(
            "response_not_found",
            "no response to acknowledge playback for",
            param="response_id",
            event_id=event.event_id,
        )
    committed = event.committed_ms if event.committed_ms is not None else event.played_ms
    played_before = response.playback.played_ms
    batch.fact(
        AckBody(
            what="playback",
            played_ms=event.played_ms,
            committed_ms=committed,
            truncate=event.truncate,
            response_id=response.id,
        )
    )
    item = state.find_item(response.item_id)
    history_committed = (
        item is not None
        and response.status != "in_progress"
        and ((item.history_ms or 0.0) + 1e-6 >= response.playback.generated_ms or item.truncated)
    )
    wire_ledger = ledger(response.playback)
    if played_before <= 0 < response.playback.played_ms:
        batch.emit(OutputAudioStarted(response_id=response.id), response_id=response.id)
    batch.emit(
        PlaybackAcknowledged(
            response_id=response.id,
            item_id=response.item_id,
            playback=wire_ledger,
            history_committed=history_committed,
            truncated=bool(item and item.truncated),
            event=PlaybackEvent(
                played_ms=event.played_ms,
                committed_ms=committed,
                truncate=event.truncate,
                playback=wire_ledger,
                history_committed=history_committed,
                item_id=response.item_id,
            ),
        ),
        response_id=response.id,
    )
    if _played_to_the_end(response, played_before):
        batch.emit(OutputAudioStopped(response_id=response.id), response_id=response.id)
    return ()


def _played_to_the_end(response: Response, played_before: float) -> bool:
    """This ack carried a finished response's playback to its end."""
    finished = response.status != "in_progress" and played_through(response)
    return finished and played_before + 1e-6 < response.playback.generated_ms


CLIENT_HANDLERS: dict[type, Handler] = {
    ce.SessionUpdateEvent: session_update,
    ce.SessionEventAck: event_ack,
    ce.SessionClose: session_close,
    ce.InputAudioAppend: audio_append,
    ce.InputAudioCommit: audio_commit,
    ce.InputCommit: audio_commit,
    ce.InputAudioClear: audio_clear,
    ce.InputCancel: input_cancel,
    ce.InputTextAppend: text_append,
    ce.ItemCreate: item_create,
    ce.ItemRetrieve: item_retrieve,
    ce.ItemDelete: item_delete,
    ce.ItemTruncate: item_truncate,
    ce.ResponseCreate: response_create,
    ce.ResponseCancel: response_cancel,
    ce.OutputAudioClear: output_clear,
    ce.BargeIn: barge_in,
    ce.TurnSignal: turn_signal,
    ce.PlaybackAck: playback_ack,
}
# Answered by the socket's attachment, never stepped: a resume (it picks the
# session) and a heartbeat (a liveness signal, not recorded).
SOCKET_EVENTS = (ce.SessionResume, ce.SessionHeartbeat)
# Another spelling of an event (vLLM-Omni's, the native one) is a subclass
# with its own tag: it is handled as the event it spells.
for _spelling in ce.CLIENT_EVENT_TYPES.values():
    if _spelling not in CLIENT_HANDLERS and _spelling not in SOCKET_EVENTS:
        CLIENT_HANDLERS[_spelling] = next(
            CLIENT_HANDLERS[base] for base in _spelling.__mro__ if base in CLIENT_HANDLERS
        )

__all__ = ["CLIENT_HANDLERS", "SOCKET_EVENTS", "HandlerContext", "item_text"]
