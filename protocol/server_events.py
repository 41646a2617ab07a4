"""Server -> client events (PROTOCOL.md, "Server -> client").

Where GA and beta spell an event differently, the beta class subclasses the
GA class with its own tag: the server journals both, side by side, and each
socket gets the spelling of its dialect (protocol.dialect).
"""

from __future__ import annotations

import typing
from typing import Literal, Union

import msgspec
from msgspec import UNSET, UnsetType

from protocol.capabilities import Capabilities
from protocol.errors import ErrorBody
from protocol.items import ContentPart, ServerItem
from protocol.session_config import (
    InputTranscription,
    NoiseReduction,
    PromptReference,
    ServerTurnDetection,
    Tool,
    ToolChoice,
    TracingConfig,
    Truncation,
)


class PlaybackLedger(msgspec.Struct):
    generated_ms: float = 0.0
    sent_ms: float = 0.0
    played_ms: float = 0.0
    committed_ms: float = 0.0


class AudioFormatDescription(msgspec.Struct):
    type: str
    rate: int


class SessionAudioInput(msgspec.Struct):
    format: AudioFormatDescription | None  # None where OpenAI has no spelling for it
    turn_detection: ServerTurnDetection | None
    transcription: InputTranscription | None
    noise_reduction: NoiseReduction | None = None


class SessionAudioOutput(msgspec.Struct):
    format: AudioFormatDescription | None
    voice: str
    speed: float


class SessionAudio(msgspec.Struct):
    input: SessionAudioInput
    output: SessionAudioOutput


class SessionExtraBody(msgspec.Struct):
    auto_response: bool
    force_listen_count: int
    chunk_delay_ms: float
    overlap_short_ack_ms: float = 400.0
    overlap_barge_in_ms: float = 400.0
    overlap_silence_rms: float = 0.01
    return_stage_metrics: bool = True
    duplex_events: bool = True


class SessionDuplex(msgspec.Struct):
    """The session's true audio formats, in our names (``pcm_f32le``, ``opus``,
    any rate): OpenAI's format fields can only say pcm16 at 24 kHz and G.711,
    so they are null for anything else."""

    input_format: AudioFormatDescription
    output_format: AudioFormatDescription


class SessionObject(msgspec.Struct):
    """Effective configuration plus live state, as announced to clients."""

    id: str
    model: str
    modalities: list[str]
    output_modalities: list[str]
    instructions: str
    voice: str
    input_audio_format: str | None
    output_audio_format: str | None
    audio: SessionAudio
    turn_detection: ServerTurnDetection | None
    input_audio_transcription: InputTranscription | None
    tools: list[Tool]
    tool_choice: ToolChoice
    temperature: float
    max_response_output_tokens: int | str
    speed: float
    overlap_policy: str
    playback_commit_policy: str
    idle_timeout_s: float | None
    extra_body: SessionExtraBody
    state: str
    turn_state: str
    epoch: int
    turn_id: int
    active_response_id: str | None
    active_item_id: str | None
    playback: PlaybackLedger
    capabilities: Capabilities
    duplex: SessionDuplex | None = None
    input_audio_noise_reduction: NoiseReduction | None = None
    tracing: str | TracingConfig | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    prompt: PromptReference | None = None
    truncation: Truncation | None = None
    response_format: str | None = None
    object: str = "realtime.session"
    type: str = "realtime"  # GA's session kind; beta clients ignore it


OpenAIStatusReason = Literal[
    "turn_detected", "client_cancelled", "max_output_tokens", "content_filter"
]


class StatusError(msgspec.Struct):
    type: str
    code: str


class ResponseStatusDetails(msgspec.Struct, omit_defaults=True):
    """OpenAI's shape: ``reason`` only from OpenAI's set; a failure's cause in
    ``error``. The server's finer cause is ``ResponseObject.duplex.reason``."""

    type: str
    reason: OpenAIStatusReason | UnsetType = UNSET
    error: StatusError | UnsetType = UNSET


class ResponseDuplex(msgspec.Struct):
    """The server's own bookkeeping of a response: an extension object beside
    OpenAI's fields (``metadata`` belongs to the client)."""

    epoch: int
    turn_id: int
    playback: PlaybackLedger
    reason: str | None = None  # barge_in, new_response, server_restart, engine_error, ...
    # How long each stage of the answer took, ms (vad_hangover_ms, asr_final_ms,
    # tts_first_clause_ms, ...): on response.done, where a stage ran.
    stage_metrics: dict[str, float] | None = None


class ResponseOutputEcho(msgspec.Struct, omit_defaults=True):
    voice: str
    format: AudioFormatDescription | None = None  # where OpenAI can spell it


class ResponseAudioEcho(msgspec.Struct):
    output: ResponseOutputEcho


class ResponseObject(msgspec.Struct):
    id: str
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]
    status_details: ResponseStatusDetails | None
    output: list[ServerItem]
    modalities: list[str]
    output_modalities: list[str]
    metadata: dict[str, str] | None
    duplex: ResponseDuplex | None = None
    usage: dict[str, int] | None = None
    object: str = "realtime.response"
    # What the response was asked to be, as OpenAI echoes it (beta spells the
    # voice and temperature at the top; GA the voice under audio.output).
    conversation_id: str | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    voice: str | None = None
    temperature: float | None = None
    output_audio_format: str | None = None  # beta's spelling, where it has one
    audio: ResponseAudioEcho | None = None


class ServerEvent(msgspec.Struct, tag_field="type"):
    event_id: str = ""
    # Absent only on attachment-scoped events (session.created, session.resumed,
    # session.replaced, pre-session errors): those are not replayed.
    server_event_seq: int | None = None


# --- session ----------------------------------------------------------------


class SessionCreated(ServerEvent, tag="session.created"):
    session: SessionObject | None = None
    attachment_generation: int = 0
    resume_token: str | None = None  # None: the model serves no resume


class SessionUpdated(ServerEvent, tag="session.updated"):
    session: SessionObject | None = None


class NoClientSecret(msgspec.Struct):
    """The beta transcription session's ``client_secret``, which the SDK's
    model requires and OpenAI's WebSocket leaves out: empty, no secret (a
    client secret is minted by ``POST /v1/realtime/client_secrets`` only)."""

    value: str = ""
    expires_at: int = 0


class TranscriptionSessionObject(msgspec.Struct):
    """A transcription session as the beta ``transcription_session.updated``
    describes it: what it hears, how turns end, how it transcribes. The GA
    events carry the whole ``SessionObject`` (type ``transcription``)."""

    id: str
    input_audio_format: str | None
    input_audio_transcription: InputTranscription | None
    turn_detection: ServerTurnDetection | None
    input_audio_noise_reduction: NoiseReduction | None
    include: list[str] | None
    duplex: SessionDuplex
    modalities: list[str] = msgspec.field(default_factory=lambda: ["text"])
    client_secret: NoClientSecret = msgspec.field(default_factory=NoClientSecret)
    object: str = "realtime.transcription_session"


class TranscriptionSessionUpdated(ServerEvent, tag="transcription_session.updated"):
    """The answer to a beta ``transcription_session.update``."""

    session: TranscriptionSessionObject | None = None


class SessionHeartbeatAck(ServerEvent, tag="session.heartbeat_ack"):
    epoch: int = 0
    session_id: str | None = None  # vLLM-Omni's client reads it here


class SessionClosed(ServerEvent, tag="session.closed"):
    reason: Literal["client_close", "disconnect", "timeout", "transport_error", "shutdown"] = (
        "client_close"
    )
    detail: str | None = None  # the reason a client gave in session.close
    session_id: str | None = None  # vLLM-Omni's client reads it here


class SessionResumed(ServerEvent, tag="session.resumed"):
    session: SessionObject | None = None
    attachment_generation: int = 0
    resume_token: str = ""
    replay_from_seq: int = 0
    replay_to_seq: int = 0


class SessionReplaced(ServerEvent, tag="session.replaced"):
    attachment_generation: int = 0


class SessionExpired(ServerEvent, tag="session.expired"):
    reason: Literal["disconnect_grace_expired", "idle_ttl_expired"] = "idle_ttl_expired"


class SessionResyncRequired(ServerEvent, tag="session.resync_required"):
    reason: Literal["journal_gap", "journal_overflow"] = "journal_gap"
    session: SessionObject | None = None
    oldest_available_seq: int = 0


# --- input ------------------------------------------------------------------


class SpeechStarted(ServerEvent, tag="input_audio_buffer.speech_started"):
    audio_start_ms: int = 0  # whole ms, as OpenAI defines it
    item_id: str = ""


class SpeechStopped(ServerEvent, tag="input_audio_buffer.speech_stopped"):
    audio_end_ms: int = 0
    item_id: str = ""


class NativeCommit(msgspec.Struct):
    turn_id: int
    epoch: int
    history_len: int
    response_create_deferred: bool
    audio_ms: float
    # vLLM-Omni's native commit event, beside ours
    type: str = "input.committed"
    session_id: str | None = None
    message: str = ""


class InputCommitted(ServerEvent, tag="input_audio_buffer.committed"):
    item_id: str = ""
    previous_item_id: str | None = None
    event: NativeCommit | None = None


class InputCleared(ServerEvent, tag="input_audio_buffer.cleared"):
    epoch: int = 0


# --- conversation -----------------------------------------------------------


class ItemAdded(ServerEvent, tag="conversation.item.added"):
    item: ServerItem | None = None
    previous_item_id: str | None = None


class ItemCreated(ItemAdded, tag="conversation.item.created"):
    pass


class ItemDone(ServerEvent, tag="conversation.item.done"):
    item: ServerItem | None = None
    previous_item_id: str | None = None


class ItemRetrieved(ServerEvent, tag="conversation.item.retrieved"):
    item: ServerItem | None = None


class ItemDeleted(ServerEvent, tag="conversation.item.deleted"):
    item_id: str = ""


class ItemTruncated(ServerEvent, tag="conversation.item.truncated"):
    item_id: str = ""
    content_index: int = 0
    audio_end_ms: int = 0  # whole ms, as OpenAI defines it


class TranscriptionUsage(msgspec.Struct, frozen=True):
    """OpenAI's duration-billed usage: the seconds of audio transcribed."""

    seconds: float
    type: Literal["duration"] = "duration"


class InputTranscriptionCompleted(
    ServerEvent, tag="conversation.item.input_audio_transcription.completed"
):
    item_id: str = ""
    content_index: int = 0
    transcript: str = ""
    usage: TranscriptionUsage = TranscriptionUsage(seconds=0.0)


class InputTranscriptionDelta(ServerEvent, tag="conversation.item.input_audio_transcription.delta"):
    """What speech recognition has heard so far of speech still going on."""

    item_id: str = ""
    content_index: int = 0
    delta: str = ""


# --- response ---------------------------------------------------------------


class ResponseCreated(ServerEvent, tag="response.created"):
    response: ResponseObject | None = None
    response_id: str | None = None  # vLLM-Omni reads the id at the top level too


class VllmOmniExtension(msgspec.Struct, omit_defaults=True):
    """Where vLLM-Omni's client looks first for a response's stage metrics."""

    stage_metrics: dict[str, float] | None = None


class ResponseDone(ServerEvent, tag="response.done"):
    response: ResponseObject | None = None
    vllm_omni: VllmOmniExtension | None = None


class OutputItemAdded(ServerEvent, tag="response.output_item.added"):
    response_id: str = ""
    output_index: int = 0
    item: ServerItem | None = None


class OutputItemDone(ServerEvent, tag="response.output_item.done"):
    response_id: str = ""
    output_index: int = 0
    item: ServerItem | None = None


class ContentPartAdded(ServerEvent, tag="response.content_part.added"):
    response_id: str = ""
    item_id: str = ""
    output_index: int = 0
    content_index: int = 0
    part: ContentPart | None = None


class ContentPartDone(ServerEvent, tag="response.content_part.done"):
    response_id: str = ""
    item_id: str = ""
    output_index: int = 0
    content_index: int = 0
    part: ContentPart | None = None


class ResponseSpeak(ServerEvent, tag="response.speak"):
    response_id: str = ""
    item_id: str = ""
    epoch: int = 0
    turn_id: int = 0


class ListeningResponse(msgspec.Struct):
    """vLLM-Omni's shape of a listen decision: a response that is listening."""

    id: str | None = None
    status: str = "listening"
    reason: str = ""


class ResponseListen(ServerEvent, tag="response.listen"):
    response_id: str | None = None
    reason: str = ""
    epoch: int = 0
    turn_id: int = 0
    response: ListeningResponse | None = None


class AudioTextMark(msgspec.Struct):
    """By ``audio_end_ms`` of the answer's audio, ``text_chars`` of its
    transcript have been spoken (what an exact truncation cuts by)."""

    text_chars: int
    audio_end_ms: float


class AudioDeltaMetadata(msgspec.Struct):
    epoch: int
    end_of_turn: bool
    audio_duration_ms: float
    audio_text_marks: list[AudioTextMark]
    playback: PlaybackLedger


class _PartRef(ServerEvent):
    response_id: str = ""
    item_id: str = ""
    output_index: int = 0
    content_index: int = 0


class OutputAudioDelta(_PartRef, tag="response.output_audio.delta"):
    delta: str = ""
    format: str = "pcm16"
    sample_rate_hz: int = 24000
    metadata: AudioDeltaMetadata | None = None


class AudioDelta(OutputAudioDelta, tag="response.audio.delta"):
    pass


class OutputAudioDone(_PartRef, tag="response.output_audio.done"):
    pass


class AudioDone(OutputAudioDone, tag="response.audio.done"):
    pass


class OutputAudioTranscriptDelta(_PartRef, tag="response.output_audio_transcript.delta"):
    delta: str = ""


class AudioTranscriptDelta(OutputAudioTranscriptDelta, tag="response.audio_transcript.delta"):
    pass


class OutputAudioTranscriptDone(_PartRef, tag="response.output_audio_transcript.done"):
    transcript: str = ""


class AudioTranscriptDone(OutputAudioTranscriptDone, tag="response.audio_transcript.done"):
    pass


class OutputTextDelta(_PartRef, tag="response.output_text.delta"):
    delta: str = ""


class TextDelta(OutputTextDelta, tag="response.text.delta"):
    pass


class OutputTextDone(_PartRef, tag="response.output_text.done"):
    text: str = ""


class TextDone(OutputTextDone, tag="response.text.done"):
    pass


class FunctionCallArgumentsDelta(ServerEvent, tag="response.function_call_arguments.delta"):
    response_id: str = ""
    item_id: str = ""
    output_index: int = 0
    call_id: str = ""
    delta: str = ""


class FunctionCallArgumentsDone(ServerEvent, tag="response.function_call_arguments.done"):
    response_id: str = ""
    item_id: str = ""
    output_index: int = 0
    call_id: str = ""
    name: str = ""
    arguments: str = ""


class RateLimit(msgspec.Struct):
    name: str
    limit: int
    remaining: int
    reset_seconds: float


class RateLimitsUpdated(ServerEvent, tag="rate_limits.updated"):
    rate_limits: list[RateLimit] = msgspec.field(default_factory=list)


# --- duplex -----------------------------------------------------------------


class OutputAudioCleared(ServerEvent, tag="output_audio_buffer.cleared"):
    response_id: str = ""  # OpenAI requires one: "" before any response
    epoch: int = 0


class OutputAudioStarted(ServerEvent, tag="output_audio_buffer.started"):
    """The client began playing a response (its first playback ack): OpenAI
    sends it where the server knows what is played (WebRTC, SIP)."""

    response_id: str = ""


class OutputAudioStopped(ServerEvent, tag="output_audio_buffer.stopped"):
    """The client played a finished response to its end."""

    response_id: str = ""


class InputDtmfReceived(ServerEvent, tag="input_audio_buffer.dtmf_event_received"):
    """OpenAI's (SIP calls'): a keypad press, and when the server had it (Unix s)."""

    event: str = ""
    received_at: int = 0


class InputTimeoutTriggered(ServerEvent, tag="input_audio_buffer.timeout_triggered"):
    """No speech for ``turn_detection.idle_timeout_ms`` after the answer
    played: the silent stretch (input audio time) and the item it becomes."""

    audio_start_ms: int = 0
    audio_end_ms: int = 0
    item_id: str = ""


class PlaybackEvent(msgspec.Struct):
    """vLLM-Omni's shape of a playback acknowledgement, beside ours."""

    played_ms: float
    committed_ms: float
    truncate: bool
    playback: PlaybackLedger
    history_committed: bool
    item_id: str | None


class PlaybackAcknowledged(ServerEvent, tag="playback.acknowledged"):
    response_id: str | None = None
    item_id: str | None = None
    playback: PlaybackLedger | None = None
    history_committed: bool = False
    truncated: bool = False
    event: PlaybackEvent | None = None


class OverlapMetadata(msgspec.Struct):
    overlap_ms: float


class OverlapDecision(ServerEvent, tag="overlap.decision"):
    action: Literal["drop", "listen", "barge_in"] = "drop"
    reason: str = ""
    response_id: str | None = None
    metadata: OverlapMetadata | None = None
    policy: str | None = None  # the session's overlap_policy that decided it


class TurnEvent(ServerEvent, tag="turn.event"):
    event: str = ""
    turn_id: int = 0
    epoch: int = 0


class Error(ServerEvent, tag="error"):
    error: ErrorBody | None = None


AnyServerEvent = Union[
    SessionCreated,
    SessionUpdated,
    TranscriptionSessionUpdated,
    SessionHeartbeatAck,
    SessionClosed,
    SessionResumed,
    SessionReplaced,
    SessionExpired,
    SessionResyncRequired,
    SpeechStarted,
    SpeechStopped,
    InputCommitted,
    InputCleared,
    ItemAdded,
    ItemCreated,
    ItemDone,
    ItemRetrieved,
    ItemDeleted,
    ItemTruncated,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    ResponseCreated,
    ResponseDone,
    OutputItemAdded,
    OutputItemDone,
    ContentPartAdded,
    ContentPartDone,
    ResponseSpeak,
    ResponseListen,
    OutputAudioDelta,
    AudioDelta,
    OutputAudioDone,
    AudioDone,
    OutputAudioTranscriptDelta,
    AudioTranscriptDelta,
    OutputAudioTranscriptDone,
    AudioTranscriptDone,
    OutputTextDelta,
    TextDelta,
    OutputTextDone,
    TextDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    RateLimitsUpdated,
    OutputAudioCleared,
    OutputAudioStarted,
    OutputAudioStopped,
    InputTimeoutTriggered,
    InputDtmfReceived,
    PlaybackAcknowledged,
    OverlapDecision,
    TurnEvent,
    Error,
]

SERVER_EVENT_TYPES: dict[str, type[ServerEvent]] = {
    cls.__struct_config__.tag: cls for cls in typing.get_args(AnyServerEvent)
}

# GA class -> its beta twin: journaled right after it; a socket gets one of them.
BETA_TWIN: dict[type[ServerEvent], type[ServerEvent]] = {
    ItemAdded: ItemCreated,
    OutputAudioDelta: AudioDelta,
    OutputAudioDone: AudioDone,
    OutputAudioTranscriptDelta: AudioTranscriptDelta,
    OutputAudioTranscriptDone: AudioTranscriptDone,
    OutputTextDelta: TextDelta,
    OutputTextDone: TextDone,
}
