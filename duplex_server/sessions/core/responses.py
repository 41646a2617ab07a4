"""The assistant response lifecycle, in the order PROTOCOL.md fixes.

created -> item added/created -> output_item.added -> content_part.added ->
speak -> (audio + transcript | text) deltas -> *.done -> content_part.done ->
output_item.done -> conversation.item.done -> response.done -> rate_limits.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Literal

import msgspec

from duplex_server.audio import encode_from_pcm16, pcm16_duration_ms
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.config import response_output_format
from duplex_server.sessions.core.items import Item, to_wire
from duplex_server.sessions.core.model_port import FunctionCallPart, ModelChunk, UnitOutput
from duplex_server.sessions.core.records import DecisionBody, FenceBody, FenceReason, ItemBody
from duplex_server.sessions.core.snapshot import ledger, openai_format
from duplex_server.sessions.core.state import ACK_SLACK_MS, Response, SessionState
from protocol.client_events import ResponseOverrides
from protocol.items import ContentPart
from protocol.server_events import (
    BETA_TWIN,
    AudioDeltaMetadata,
    AudioTextMark,
    ContentPartAdded,
    ContentPartDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    ItemAdded,
    ItemDone,
    ListeningResponse,
    OpenAIStatusReason,
    OutputAudioDelta,
    OutputAudioDone,
    OutputAudioStopped,
    OutputAudioTranscriptDelta,
    OutputAudioTranscriptDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    RateLimit,
    RateLimitsUpdated,
    ResponseAudioEcho,
    ResponseCreated,
    ResponseDone,
    ResponseDuplex,
    ResponseListen,
    ResponseObject,
    ResponseOutputEcho,
    ResponseSpeak,
    ResponseStatusDetails,
    ServerEvent,
    StatusError,
    VllmOmniExtension,
)

# Our finer cause of a response's end -> the nearest reason OpenAI defines
# (absent where none fits; the cause itself is in the ``duplex`` extension).
_OPENAI_REASON: dict[str, OpenAIStatusReason] = {
    "barge_in": "turn_detected",
    "client_cancelled": "client_cancelled",
    "output_cleared": "client_cancelled",
    "input_cancelled": "client_cancelled",
    "new_response": "client_cancelled",
    "model_yield": "turn_detected",  # a duplex model gave the floor back to the user
}


def played_through(response: Response) -> bool:
    """The client's acks cover all the audio the response made (some)."""
    return 0 < response.playback.generated_ms <= response.playback.played_ms + ACK_SLACK_MS


def _is_audio(response: Response) -> bool:
    return "audio" in response.modalities


def _asked(response: Response, field: str, default):
    """A response.create's override of ``field``, else the session's value."""
    value = getattr(response.overrides, field, msgspec.UNSET)
    return default if value is msgspec.UNSET else value


def _asked_max_tokens(state: SessionState, response: Response) -> int | Literal["inf"]:
    overrides = response.overrides
    if overrides is not None:
        for value in (overrides.max_output_tokens, overrides.max_response_output_tokens):
            if value is not msgspec.UNSET:
                return value
    limit = state.config.max_output_tokens
    return "inf" if limit == "inf" else int(limit)


def response_object(batch: Batch, response: Response) -> ResponseObject:
    """The response as OpenAI describes it: status, output, the client's
    metadata and what it asked the response to be (modalities, voice,
    limits: a client matches its response.create to response.created by
    these), and our bookkeeping in the ``duplex`` extension."""
    state = batch.state
    named = response.overrides.voice_named() if response.overrides is not None else msgspec.UNSET
    asked_voice = state.config.voice if named is msgspec.UNSET else named
    voice = asked_voice if "audio" in response.modalities else None
    fmt = response_output_format(response.overrides, state.config.output_format)
    beta_format, ga_format = openai_format(fmt)
    return ResponseObject(
        id=response.id,
        status=response.status,  # type: ignore[arg-type]  # the fold keeps these five
        status_details=status_details(response),
        output=[to_wire(item) for item in _output_items(state, response)],
        modalities=list(response.modalities),
        output_modalities=list(response.modalities),
        metadata=response.metadata,
        conversation_id=f"conv_{state.session_id[-10:]}",
        max_output_tokens=_asked_max_tokens(state, response),
        voice=voice,
        temperature=_asked(response, "temperature", state.config.temperature),
        output_audio_format=beta_format if voice else None,
        audio=ResponseAudioEcho(ResponseOutputEcho(voice, ga_format)) if voice else None,
        duplex=ResponseDuplex(
            epoch=response.epoch,
            turn_id=state.turn_id,
            playback=ledger(response.playback),
            reason=response.reason or None,
            stage_metrics=_stage_metrics(response) if _reports_stages(state, response) else None,
        ),
    )


def _reports_stages(state: SessionState, response: Response) -> bool:
    return response.status != "in_progress" and state.config.return_stage_metrics


def _stage_metrics(response: Response) -> dict[str, float] | None:
    return {name: round(ms, 3) for name, ms in response.stage_ms.items()} or None


def _output_items(state: SessionState, response: Response) -> list[Item]:
    ids = [response.item_id, *response.call_item_ids]
    return [item for item in map(state.find_item, ids) if item is not None]


def status_details(response: Response) -> ResponseStatusDetails | None:
    """OpenAI's status details: a reason from OpenAI's set, a failure as an error."""
    if response.status == "in_progress":
        return None
    if response.status == "failed":
        return ResponseStatusDetails(
            type="failed",
            error=StatusError(type="server_error", code=response.reason or "server_error"),
        )
    reason = _OPENAI_REASON.get(response.reason)
    return ResponseStatusDetails(type=response.status, reason=reason or msgspec.UNSET)


def resolve_modalities(
    config_modalities: list[str], overrides: ResponseOverrides | None
) -> list[str]:
    if overrides is not None:
        for field in (overrides.output_modalities, overrides.modalities):
            if field is not msgspec.UNSET:
                return list(field)
    return list(config_modalities)


def start_response(
    batch: Batch, overrides: ResponseOverrides | None = None, requested: bool = False
) -> Response:
    """``requested``: the client's response.create started it (not auto_response)."""
    state = batch.state
    response_id = f"resp_{state.session_id[-10:]}_{state.response_count + 1}"
    item_id = f"item_{response_id}"
    modalities = resolve_modalities(state.config.modalities, overrides)
    batch.fact(
        DecisionBody(
            action="speak",
            response_id=response_id,
            item_id=item_id,
            modalities=modalities,
            overrides=overrides,
            requested=requested,
        ),
        origin="server",
    )
    response = state.response
    assert response is not None
    item = state.find_item(item_id)
    assert item is not None
    previous = state.items[-2].id if len(state.items) > 1 else None
    batch.emit(
        ResponseCreated(response=response_object(batch, response), response_id=response_id),
        response_id=response_id,
    )
    emit_twins(batch, ItemAdded(item=to_wire(item), previous_item_id=previous), response_id)
    batch.emit(
        OutputItemAdded(response_id=response_id, item=to_wire(item)), response_id=response_id
    )
    part = (
        ContentPart(type="audio", transcript="")
        if _is_audio(response)
        else ContentPart(type="text", text="")
    )
    batch.emit(
        ContentPartAdded(response_id=response_id, item_id=item_id, part=part),
        response_id=response_id,
    )
    if _is_audio(response):
        batch.emit(
            ResponseSpeak(
                response_id=response_id, item_id=item_id, epoch=state.epoch, turn_id=state.turn_id
            ),
            response_id=response_id,
        )
    return response


def emit_chunk(
    batch: Batch,
    response: Response,
    chunk: ModelChunk,
    encode: Callable[[bytes, int], bytes] | None = None,
) -> None:
    """One model chunk: an audio delta paired with its transcript delta, or text.

    ``encode(pcm16, rate)``: the response's stream encoder, which the
    runtime keeps across its chunks (a resampler with no seams between
    chunks; Opus's encoder); without one, each chunk is encoded on its own."""
    rid, iid = response.id, response.item_id
    if not _is_audio(response):
        if chunk.text:
            text_delta = OutputTextDelta(delta=chunk.text, response_id=rid, item_id=iid)
            emit_twins(batch, text_delta, response_id=rid, text=chunk.text, stage_ms=chunk.stage_ms)
        return
    out_fmt = response_output_format(response.overrides, batch.state.config.output_format)
    encoded = (
        encode(chunk.audio, chunk.sample_rate_hz)
        if encode is not None
        else encode_from_pcm16(chunk.audio, chunk.sample_rate_hz, out_fmt)
    )
    duration = pcm16_duration_ms(len(chunk.audio), chunk.sample_rate_hz)
    after = msgspec.structs.replace(
        response.playback,
        generated_ms=response.playback.generated_ms + duration,
        sent_ms=response.playback.sent_ms + duration,
    )
    metadata = AudioDeltaMetadata(
        epoch=response.epoch,
        end_of_turn=False,
        audio_duration_ms=round(duration, 3),
        audio_text_marks=[
            AudioTextMark(
                text_chars=len(response.transcript) + len(chunk.text),
                audio_end_ms=round(after.generated_ms, 3),
            )
        ],
        playback=ledger(after),
    )
    audio_delta = OutputAudioDelta(
        delta=base64.b64encode(encoded).decode(),
        format=out_fmt.name,
        sample_rate_hz=out_fmt.sample_rate_hz,
        metadata=metadata,
        response_id=rid,
        item_id=iid,
    )
    emit_twins(batch, audio_delta, response_id=rid, audio_ms=duration, stage_ms=chunk.stage_ms)
    transcript_delta = OutputAudioTranscriptDelta(delta=chunk.text, response_id=rid, item_id=iid)
    emit_twins(batch, transcript_delta, response_id=rid, text=chunk.text)


def emit_twins(
    batch: Batch,
    event: ServerEvent,
    response_id: str | None = None,
    audio_ms: float = 0.0,
    text: str = "",
    stage_ms: dict[str, float] | None = None,
) -> None:
    """A GA event and, right after it, its beta twin with the same content
    (what the event adds to the response is counted once, on the GA one)."""
    batch.emit(event, response_id=response_id, audio_ms=audio_ms, text=text, stage_ms=stage_ms)
    twin = BETA_TWIN[type(event)]
    fields = msgspec.structs.asdict(event)
    batch.emit(twin(**fields), response_id=response_id)


def finish_response(
    batch: Batch, status: str, reason: str = "", stage_ms: dict[str, float] | None = None
) -> None:
    """End the active response. ``stage_ms``: the model's stage times that
    came after its last output, journaled on the output's done event (so
    ``response.done`` and a replay report them)."""
    state = batch.state
    response = state.response
    if response is None:
        return
    rid, iid = response.id, response.item_id
    if _is_audio(response):
        emit_twins(
            batch, OutputAudioDone(response_id=rid, item_id=iid), response_id=rid, stage_ms=stage_ms
        )
        transcript_done = OutputAudioTranscriptDone(
            transcript=response.transcript, response_id=rid, item_id=iid
        )
        emit_twins(batch, transcript_done, response_id=rid)
        part = ContentPart(type="audio", transcript=response.transcript)
    else:
        text_done = OutputTextDone(text=response.transcript, response_id=rid, item_id=iid)
        emit_twins(batch, text_done, response_id=rid, stage_ms=stage_ms)
        part = ContentPart(type="text", text=response.transcript)
    batch.emit(ContentPartDone(part=part, response_id=rid, item_id=iid), response_id=rid)
    batch.fact(
        DecisionBody(
            action="response_done",
            response_id=response.id,
            status=status,  # type: ignore[arg-type]  # callers pass a ResponseStatus
            reason=reason,
        ),
        origin="server",
    )
    if played_through(response):
        # the client's acks caught up before the answer ended: its playback is over
        batch.emit(OutputAudioStopped(response_id=response.id), response_id=response.id)
    item = state.find_item(response.item_id)
    wire_item = to_wire(item) if item is not None else None
    batch.emit(OutputItemDone(response_id=response.id, item=wire_item), response_id=response.id)
    batch.emit(ItemDone(item=wire_item), response_id=response.id)
    done = response_object(batch, response)
    stages = done.duplex.stage_metrics if done.duplex is not None else None
    extension = VllmOmniExtension(stage_metrics=stages) if stages else None
    batch.emit(ResponseDone(response=done, vllm_omni=extension), response_id=response.id)
    batch.emit(
        RateLimitsUpdated(
            rate_limits=[
                RateLimit(name="requests", limit=1_000_000, remaining=1_000_000, reset_seconds=0.0)
            ]
        )
    )


def emit_function_call(
    batch: Batch,
    response: Response,
    call: FunctionCallPart,
    stage_ms: dict[str, float] | None = None,
) -> None:
    """A tool call the model made: a ``function_call`` item of the response,
    in the conversation and in the response's output, its arguments told
    in one delta (the model hands over a complete call). ``stage_ms``: the model's
    stage times that came with it (journaled on its arguments' done event)."""
    state, rid = batch.state, response.id
    item_id = f"{response.item_id}_call{len(response.call_item_ids) + 1}"
    previous = state.items[-1].id if state.items else None
    item = Item(
        id=item_id,
        type="function_call",
        call_id=call.call_id,
        name=call.name,
        arguments=call.arguments,
    )
    body = ItemBody(
        op="create", item_id=item_id, item=item, previous_item_id=previous, response_id=rid
    )
    batch.fact(body, origin="server")
    index = len(response.call_item_ids)  # the message is output 0
    wire = to_wire(item)
    # OpenAI's order: the item in progress with no arguments yet, the
    # arguments, then the item completed (clients run the call on that one).
    opened = msgspec.structs.replace(wire, status="in_progress", arguments="")
    batch.emit(OutputItemAdded(response_id=rid, output_index=index, item=opened), response_id=rid)
    emit_twins(batch, ItemAdded(item=opened, previous_item_id=previous), rid)
    call_id, arguments = call.call_id, call.arguments
    batch.emit(
        FunctionCallArgumentsDelta(
            response_id=rid, item_id=item_id, output_index=index, call_id=call_id, delta=arguments
        ),
        response_id=rid,
    )
    batch.emit(
        FunctionCallArgumentsDone(
            response_id=rid,
            item_id=item_id,
            output_index=index,
            call_id=call_id,
            name=call.name,
            arguments=arguments,
        ),
        response_id=rid,
        stage_ms=stage_ms,
    )
    batch.emit(OutputItemDone(response_id=rid, output_index=index, item=wire), response_id=rid)
    batch.emit(ItemDone(item=wire, previous_item_id=previous), response_id=rid)


def project_unit_outputs(
    batch: Batch,
    outputs: list[UnitOutput],
    encoder_for: Callable[[str], Callable[[bytes, int], bytes] | None],
) -> None:
    """Model output onto the wire and into the log. A turn model's chunks
    (no decision) go into the response the session opened. A native duplex
    model decides the floor per unit: ``speak`` (or the first audio or text)
    opens a response and holds it open across units; ``end_of_turn`` (or
    ``listen`` while speaking) completes it; ``yield`` ends it cut short;
    each change of the floor is a ``turn.event`` (``Batch.settle``), and
    giving it back a logged listen decision (``response.listen``). ``listen`` while listening
    changes nothing and is not logged (it comes every unit).
    ``encoder_for(response_id)``: the stream encoder of formats with state."""
    for output in outputs:
        response = batch.state.response
        produced = bool(output.audio or output.text or output.function_call)
        if response is None and (output.decision == "speak" or produced):
            response = start_response(batch)
        if response is not None and (output.audio or output.text):
            chunk = ModelChunk(
                audio=output.audio,
                sample_rate_hz=output.sample_rate_hz,
                text=output.text,
                stage_ms=output.stage_ms,
            )
            emit_chunk(batch, response, chunk, encoder_for(response.id))
        if response is not None and output.function_call is not None:
            told = bool(output.audio or output.text)  # its stage times went with them
            stages = None if told else output.stage_ms
            emit_function_call(batch, response, output.function_call, stages)
        if response is not None and output.decision in ("end_of_turn", "listen"):
            finish_response(batch, "completed")
            listen(batch, "model_end_of_turn")
        elif response is not None and output.decision == "yield":
            finish_response(batch, "cancelled", "model_yield")
            listen(batch, "model_yield")


def advance_epoch(batch: Batch, reason: FenceReason) -> None:
    batch.fact(FenceBody(reason=reason, new_epoch=batch.state.epoch + 1), origin="server")


def cancel_response(batch: Batch, reason: FenceReason, status: str = "cancelled") -> str | None:
    """Fence off the active response and close it; returns its id for the engine abort."""
    response = batch.state.response
    advance_epoch(batch, reason)
    if response is None:
        return None
    finish_response(batch, status, reason)
    return response.id


def listen(batch: Batch, reason: str) -> None:
    state = batch.state
    batch.fact(DecisionBody(action="listen", reason=reason), origin="server")
    batch.emit(
        ResponseListen(
            reason=reason,
            epoch=state.epoch,
            turn_id=state.turn_id,
            response=ListeningResponse(reason=reason),
        )
    )
