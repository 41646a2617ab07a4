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


class TurnDetection(msgspec.Struct, omit_defaults=True):
    """``server_vad``, or OpenAI's ``semantic_vad`` (served by the same VAD,
    its ``eagerness`` setting the silence that ends a turn)."""

    type: str = "server_vad"
    threshold: Unit | UnsetType = UNSET
    prefix_padding_ms: NonNegInt | UnsetType = UNSET
    silence_duration_ms: NonNegInt | UnsetType = UNSET
    create_response: bool | UnsetType = UNSET
    interrupt_response: bool | UnsetType = UNSET
    eagerness: Eagerness | UnsetType = UNSET


class ServerTurnDetection(TurnDetection, omit_defaults=False):
    """Turn detection as the server announces it: ``type`` always present
    (OpenAI's models tell server_vad from semantic_vad by it)."""


class AudioFormatObject(msgspec.Struct, omit_defaults=True):
    """GA spelling: ``{"type": "audio/pcm", "rate": 24000}``."""

    type: str
    rate: Annotated[int, Meta(gt=0)] | UnsetType = UNSET


AudioFormatSpec = str | AudioFormatObject


class InputTranscription(msgspec.Struct, omit_defaults=True):
    model: str | UnsetType = UNSET
    language: str | UnsetType = UNSET
    prompt: str | UnsetType = UNSET


Rate = Annotated[int, Meta(gt=0)]  # the served range: audio_formats.resolve_format


class AudioInputConfig(msgspec.Struct, omit_defaults=True):
    format: AudioFormatSpec | UnsetType = UNSET
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


# The tools a session can offer a model, and how it may use them. (OpenAI's
# object form of tool_choice, naming one function, is not taken yet.)
ToolChoice = Literal["auto", "none", "required"]


class Tool(msgspec.Struct, omit_defaults=True):
    type: Literal["function"] = "function"
    name: str = ""
    description: str = ""
    # A JSON Schema is open-ended by nature; it is stored and echoed verbatim.
    parameters: dict[str, object] = msgspec.field(default_factory=dict)


class ExtraBody(msgspec.Struct, omit_defaults=True):
    """Duplex and model knobs that have no place in the OpenAI schema."""

    auto_response: bool | UnsetType = UNSET
    force_listen_count: NonNegInt | UnsetType = UNSET
    # echo model: pause between streamed chunks, to make responses long-lived.
    chunk_delay_ms: Annotated[float, Meta(ge=0.0, le=10_000.0)] | UnsetType = UNSET


class SessionUpdate(msgspec.Struct, omit_defaults=True):
    type: str | UnsetType = UNSET  # GA clients send "realtime"
    model: str | UnsetType = UNSET
    modalities: list[Modality] | UnsetType = UNSET
    output_modalities: list[Modality] | UnsetType = UNSET
    instructions: str | UnsetType = UNSET
    voice: str | UnsetType = UNSET
    input_audio_format: AudioFormatSpec | UnsetType = UNSET
    output_audio_format: AudioFormatSpec | UnsetType = UNSET
    input_sample_rate_hz: Rate | UnsetType = UNSET
    output_sample_rate_hz: Rate | UnsetType = UNSET
    # vLLM-Omni: the input rate, top level
    sample_rate_hz: Rate | UnsetType = UNSET
    audio: AudioConfig | UnsetType = UNSET
    turn_detection: TurnDetection | None | UnsetType = UNSET
    input_audio_transcription: InputTranscription | None | UnsetType = UNSET
    tools: list[Tool] | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | UnsetType = UNSET
    max_response_output_tokens: NonNegInt | Literal["inf"] | UnsetType = UNSET
    max_output_tokens: NonNegInt | Literal["inf"] | UnsetType = UNSET
    speed: PositiveFloat | UnsetType = UNSET
    overlap_policy: OverlapPolicy | UnsetType = UNSET
    playback_commit_policy: PlaybackCommitPolicy | UnsetType = UNSET
    # A session may ask to be kept a day without a word, not forever.
    idle_timeout_s: Annotated[float, Meta(gt=0.0, le=MAX_IDLE_TIMEOUT_S)] | None | UnsetType = UNSET
    ref_audio: str | None | UnsetType = UNSET
    extra_body: ExtraBody | UnsetType = UNSET
