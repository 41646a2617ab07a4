"""The ``session`` object clients send in ``session.update``.

Every field is optional (``UNSET`` = "leave as it is") because an update is a
patch. ``turn_detection`` distinguishes ``null`` (model-owned turn-taking)
from absent. Both the beta spellings (``input_audio_format``, ``modalities``)
and the GA ones (``audio.input.format``, ``output_modalities``) are accepted.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

Modality = Literal["audio", "text"]
OverlapPolicy = Literal["listen_only", "barge_in_on_speech"]
PlaybackCommitPolicy = Literal["ack_only", "commit_all_on_done"]

Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
NonNegInt = Annotated[int, Meta(ge=0)]
PositiveFloat = Annotated[float, Meta(gt=0.0)]
MAX_IDLE_TIMEOUT_S = 24 * 3600.0


Eagerness = Literal["low", "medium", "high", "auto"]
# GA's session kinds: a conversation, or OpenAI's transcription session
# (audio in, turn detection and transcripts out, never a response).
SessionType = Literal["realtime", "transcription"]


class TurnDetection(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """``server_vad``, or OpenAI's ``semantic_vad`` (the same VAD finds the
    pauses, an end-of-turn model judges them; ``eagerness`` sets the pause,
    the model's threshold and the longest wait). A key the server
    does not know is refused (``invalid_event`` naming it): a VAD setting
    silently ignored would change when turns end without a word."""

    type: str = "server_vad"
    threshold: Unit | UnsetType = UNSET
    prefix_padding_ms: NonNegInt | UnsetType = UNSET
    silence_duration_ms: NonNegInt | UnsetType = UNSET
    create_response: bool | UnsetType = UNSET
    interrupt_response: bool | UnsetType = UNSET
    eagerness: Eagerness | UnsetType = UNSET
    # vLLM-Omni: speech shorter than this is not a turn (a cough, a click).
    min_speech_duration_ms: NonNegInt | UnsetType = UNSET
    # OpenAI's: no speech this long after the answer played commits the
    # silence and answers it (server_vad; sessions/runtime/idle_timer.py).
    idle_timeout_ms: NonNegInt | None | UnsetType = UNSET


class ServerTurnDetection(TurnDetection, omit_defaults=False, forbid_unknown_fields=False):
    """Turn detection as the server announces it: ``type`` always present
    (OpenAI's models tell server_vad from semantic_vad by it)."""


class AudioFormatObject(msgspec.Struct, omit_defaults=True):
    """GA spelling: ``{"type": "audio/pcm", "rate": 24000}``."""

    type: str
    rate: Annotated[int, Meta(gt=0)] | UnsetType = UNSET


AudioFormatSpec = str | AudioFormatObject


class InputTranscription(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """OpenAI's transcription settings. ``keywords`` join the prompt (a
    Whisper prompt is what guides its words); ``languages`` naming one
    language is that ``language``; ``delay`` is refused by the server (its
    transcripts come as the recogniser hears). A key not known here is
    refused (``invalid_event``), never dropped."""

    model: str | UnsetType = UNSET
    language: str | UnsetType = UNSET
    prompt: str | UnsetType = UNSET
    keywords: list[str] | UnsetType = UNSET
    languages: list[str] | UnsetType = UNSET
    delay: str | UnsetType = UNSET

    def heard_language(self) -> str | None:
        """The language the recogniser is told: ``language``, else the one
        ``languages`` names (several: it listens for any)."""
        if isinstance(self.language, str) and self.language:
            return self.language
        if isinstance(self.languages, list) and len(self.languages) == 1:
            return self.languages[0]
        return None

    def heard_prompt(self) -> str | None:
        """The prompt the recogniser is given: ``prompt`` and the ``keywords``."""
        parts = [self.prompt] if isinstance(self.prompt, str) and self.prompt else []
        if isinstance(self.keywords, list) and self.keywords:
            parts.append(", ".join(self.keywords))
        return " ".join(parts) or None


Rate = Annotated[int, Meta(gt=0)]  # the served range: audio_formats.resolve_format


class NoiseReduction(msgspec.Struct, omit_defaults=True):
    """OpenAI's input noise reduction, stored and echoed: the server's
    recognisers and VAD take the audio as it comes."""

    type: Literal["near_field", "far_field"] | UnsetType = UNSET


class AudioInputConfig(msgspec.Struct, omit_defaults=True):
    format: AudioFormatSpec | UnsetType = UNSET
    noise_reduction: NoiseReduction | None | UnsetType = UNSET
    sample_rate_hz: Rate | UnsetType = UNSET  # vLLM-Omni's spelling of format.rate
    turn_detection: TurnDetection | None | UnsetType = UNSET
    transcription: InputTranscription | None | UnsetType = UNSET


class AudioOutputConfig(msgspec.Struct, omit_defaults=True):
    format: AudioFormatSpec | UnsetType = UNSET
    sample_rate_hz: Rate | UnsetType = UNSET  # vLLM-Omni's spelling of format.rate
    voice: str | UnsetType = UNSET
    speed: PositiveFloat | UnsetType = UNSET


class AudioConfig(msgspec.Struct, omit_defaults=True):
    input: AudioInputConfig | UnsetType = UNSET
    output: AudioOutputConfig | UnsetType = UNSET


# The tools a session can offer a model, and how it may use them.
ToolChoiceMode = Literal["auto", "none", "required"]


class ToolChoiceFunctionName(msgspec.Struct):
    name: str


class ToolChoiceFunction(msgspec.Struct, omit_defaults=True):
    """The object form, naming the one function the model must call: GA's
    ``{"type": "function", "name": ...}`` or the Chat Completions spelling
    ``{"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"]
    name: str | UnsetType = UNSET
    function: ToolChoiceFunctionName | UnsetType = UNSET

    def function_name(self) -> str | None:
        if isinstance(self.name, str):
            return self.name
        return None if isinstance(self.function, UnsetType) else self.function.name


ToolChoice = ToolChoiceMode | ToolChoiceFunction


class TracingConfig(msgspec.Struct, omit_defaults=True):
    """OpenAI's tracing settings: stored and echoed (the server keeps its own
    record of every session: the log)."""

    workflow_name: str | UnsetType = UNSET
    group_id: str | UnsetType = UNSET
    metadata: dict[str, str] | UnsetType = UNSET


class PromptReference(msgspec.Struct, omit_defaults=True):
    """OpenAI's stored-prompt reference: stored and echoed; ``instructions``
    is what the model is given (the server has no prompt store)."""

    id: str
    version: str | UnsetType = UNSET
    variables: dict[str, str] | UnsetType = UNSET


# OpenAI's metadata bounds: 16 pairs, keys up to 64 characters, values up to 512.
Metadata = Annotated[
    dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
    Meta(max_length=16),
]
Include = Literal["item.input_audio_transcription.logprobs"]


class TokenLimits(msgspec.Struct, omit_defaults=True):
    post_instructions: NonNegInt | UnsetType = UNSET


class RetentionRatio(msgspec.Struct, omit_defaults=True):
    """GA's truncation by retention ratio: stored and echoed (no model here
    has a context window to overflow yet)."""

    type: Literal["retention_ratio"]
    retention_ratio: Unit
    token_limits: TokenLimits | UnsetType = UNSET


Truncation = Literal["auto", "disabled"] | RetentionRatio


class Tool(msgspec.Struct):
    type: Literal["function"] = "function"
    name: str = ""
    description: str = ""
    # A JSON Schema is open-ended by nature; it is stored and echoed verbatim.
    parameters: dict[str, object] = msgspec.field(default_factory=dict)


OverlapMs = Annotated[float, Meta(ge=0.0, le=10_000.0)]
Rms = Annotated[float, Meta(ge=0.0, le=1.0)]  # a fraction of full scale


class OverlapThresholds(msgspec.Struct, omit_defaults=True):
    """How speech over the assistant is judged (PROTOCOL.md, "Overlap"):
    speech that ends before ``overlap_short_ack_ms`` is a remark the answer
    talks through, speech that lasts ``overlap_barge_in_ms`` takes the floor;
    with neither server VAD nor the client's hints, a chunk whose RMS is
    under ``overlap_silence_rms`` (of full scale) is silence. Top level or
    under ``extra_body``, as vLLM-Omni's clients send them."""

    overlap_short_ack_ms: OverlapMs | UnsetType = UNSET
    overlap_barge_in_ms: OverlapMs | UnsetType = UNSET
    overlap_silence_rms: Rms | UnsetType = UNSET


class ExtraBody(OverlapThresholds, omit_defaults=True, forbid_unknown_fields=True):
    """Duplex and model knobs that have no place in the OpenAI schema. A key
    the server does not know is refused by name: a model knob silently
    ignored would change the answer without a word."""

    auto_response: bool | UnsetType = UNSET
    force_listen_count: NonNegInt | UnsetType = UNSET
    # echo model: pause between streamed chunks, to make responses long-lived.
    chunk_delay_ms: Annotated[float, Meta(ge=0.0, le=10_000.0)] | UnsetType = UNSET
    # vLLM-Omni's Nemotron preset offers its tools here: the session's tools.
    realtime_tools: list[Tool] | UnsetType = UNSET
    # vLLM-Omni's switch for the stage times in response.done (duplex.stage_metrics
    # and vllm_omni.stage_metrics); on unless a client turns it off.
    return_stage_metrics: bool | UnsetType = UNSET
    # The plain OpenAI endpoint sends OpenAI's event types only; true adds the
    # duplex extension events (response.speak, response.listen, turn.event,
    # overlap.decision) there too. The duplex wire always sends them.
    duplex_events: bool | UnsetType = UNSET


class SessionUpdate(OverlapThresholds, omit_defaults=True):
    # GA clients send "realtime" or "transcription"; fixed once the session
    # has heard or said anything (commands/session.py)
    type: SessionType | UnsetType = UNSET
    model: str | UnsetType = UNSET
    modalities: list[Modality] | UnsetType = UNSET
    output_modalities: list[Modality] | UnsetType = UNSET
    instructions: str | UnsetType = UNSET
    voice: str | UnsetType = UNSET
    input_audio_format: AudioFormatSpec | UnsetType = UNSET
    output_audio_format: AudioFormatSpec | UnsetType = UNSET
    input_sample_rate_hz: Rate | UnsetType = UNSET
    output_sample_rate_hz: Rate | UnsetType = UNSET
    # vLLM-Omni: the input rate, top level (either spelling)
    sample_rate_hz: Rate | UnsetType = UNSET
    sample_rate: Rate | UnsetType = UNSET
    audio: AudioConfig | UnsetType = UNSET
    turn_detection: TurnDetection | None | UnsetType = UNSET
    input_audio_transcription: InputTranscription | None | UnsetType = UNSET
    tools: list[Tool] | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | UnsetType = UNSET
    max_response_output_tokens: NonNegInt | Literal["inf"] | UnsetType = UNSET
    max_output_tokens: NonNegInt | Literal["inf"] | UnsetType = UNSET
    max_tokens: NonNegInt | Literal["inf"] | UnsetType = UNSET  # vLLM-Omni's spelling
    speed: PositiveFloat | UnsetType = UNSET
    input_audio_noise_reduction: NoiseReduction | None | UnsetType = UNSET
    tracing: Literal["auto"] | TracingConfig | None | UnsetType = UNSET
    metadata: Metadata | None | UnsetType = UNSET
    include: list[Include] | None | UnsetType = UNSET
    prompt: PromptReference | None | UnsetType = UNSET
    truncation: Truncation | UnsetType = UNSET
    response_format: Annotated[str, Meta(max_length=64)] | None | UnsetType = UNSET
    overlap_policy: OverlapPolicy | UnsetType = UNSET
    playback_commit_policy: PlaybackCommitPolicy | UnsetType = UNSET
    # A session may ask to be kept a day without a word, not forever.
    idle_timeout_s: Annotated[float, Meta(gt=0.0, le=MAX_IDLE_TIMEOUT_S)] | None | UnsetType = UNSET
    ref_audio: str | None | UnsetType = UNSET
    extra_body: ExtraBody | UnsetType = UNSET
