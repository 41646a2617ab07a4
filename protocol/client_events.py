"""Client -> server events (PROTOCOL.md, "Client -> server").

One Struct per event type, discriminated by ``type``. Native ``/v1/duplex``
command names are subclasses carrying another tag, so handlers see one class.
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal, Union

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocol.items import ConversationItem
from protocol.session_config import (
    AudioFormatSpec,
    AudioOutputConfig,
    InputTranscription,
    Modality,
    SessionUpdate,
    Tool,
    ToolChoice,
    TurnDetection,
)

NonNegInt = Annotated[int, Meta(ge=0)]
NonNegFloat = Annotated[float, Meta(ge=0.0)]


class ClientEvent(msgspec.Struct, tag_field="type", omit_defaults=True):
    event_id: str | None = None
    # Duplex clients may stamp the epoch they believe current; older -> stale_epoch.
    epoch: NonNegInt | None = None


class SessionUpdateEvent(ClientEvent, tag="session.update"):
    session: SessionUpdate = msgspec.field(default_factory=SessionUpdate)


class SessionHeartbeat(ClientEvent, tag="session.heartbeat"):
    pass


class SessionEventAck(ClientEvent, tag="session.event_ack"):
    server_event_seq: NonNegInt = 0


class SessionClose(ClientEvent, tag="session.close"):
    pass


class SessionResume(ClientEvent, tag="session.resume"):
    session_id: str = ""
    resume_token: str = ""
    last_received_server_event_seq: NonNegInt = 0


class InputAudioAppend(ClientEvent, tag="input_audio_buffer.append"):
    audio: str = ""
    format: AudioFormatSpec | None = None
    sample_rate_hz: Annotated[int, Meta(gt=0, le=384_000)] | None = None
    duration_ms: NonNegFloat | None = None
    audio_end_ms: NonNegFloat | None = None
    is_speech: bool | None = None
    video_frames: list[str] = msgspec.field(default_factory=list)


class InputAudioCommit(ClientEvent, tag="input_audio_buffer.commit"):
    final: bool | None = None
    response_create: bool | None = None
    is_speech: bool | None = None


class InputCommit(InputAudioCommit, tag="input.commit"):
    """Native spelling of ``input_audio_buffer.commit``."""


class InputAudioClear(ClientEvent, tag="input_audio_buffer.clear"):
    pass


class InputCancel(ClientEvent, tag="input.cancel"):
    pass


class InputTextAppend(ClientEvent, tag="input.text.append"):
    text: str = ""


class ItemCreate(ClientEvent, tag="conversation.item.create"):
    item: ConversationItem = msgspec.field(default_factory=ConversationItem)
    previous_item_id: str | None = None


class ItemRetrieve(ClientEvent, tag="conversation.item.retrieve"):
    item_id: str = ""


class ItemDelete(ClientEvent, tag="conversation.item.delete"):
    item_id: str = ""


class ItemTruncate(ClientEvent, tag="conversation.item.truncate"):
    item_id: str = ""
    content_index: NonNegInt = 0
    audio_end_ms: NonNegFloat = 0.0


class ResponseAudio(msgspec.Struct, omit_defaults=True):
    """GA's ``response.audio``: the answer's voice and format."""

    output: AudioOutputConfig | UnsetType = UNSET


class ResponseOverrides(msgspec.Struct, omit_defaults=True):
    modalities: list[Modality] | UnsetType = UNSET
    output_modalities: list[Modality] | UnsetType = UNSET
    instructions: str | UnsetType = UNSET
    voice: str | UnsetType = UNSET
    output_audio_format: AudioFormatSpec | UnsetType = UNSET
    tools: list[Tool] | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | UnsetType = UNSET
    max_output_tokens: NonNegInt | Literal["inf"] | UnsetType = UNSET
    max_response_output_tokens: NonNegInt | Literal["inf"] | UnsetType = UNSET
    audio: ResponseAudio | UnsetType = UNSET
    conversation: str | UnsetType = UNSET  # only "auto": out-of-band answers are refused
    input: list[dict[str, object]] | UnsetType = UNSET  # refused: answers see the conversation
    metadata: dict[str, str] | UnsetType = UNSET

    def voice_named(self) -> str | UnsetType:
        """The voice asked for, in either spelling (top level wins)."""
        if not isinstance(self.voice, UnsetType):
            return self.voice
        return self.audio_output().voice

    def format_named(self) -> AudioFormatSpec | UnsetType:
        """The output format asked for, in either spelling (top level wins)."""
        if not isinstance(self.output_audio_format, UnsetType):
            return self.output_audio_format
        return self.audio_output().format

    def rate_named(self) -> int | UnsetType:
        """vLLM-Omni's ``audio.output.sample_rate_hz``."""
        return self.audio_output().sample_rate_hz

    def speed_named(self) -> float | UnsetType:
        return self.audio_output().speed

    def audio_output(self) -> AudioOutputConfig:
        if isinstance(self.audio, UnsetType) or isinstance(self.audio.output, UnsetType):
            return AudioOutputConfig()
        return self.audio.output


class ResponseCreate(ClientEvent, tag="response.create"):
    response: ResponseOverrides | None = None


class ResponseCancel(ClientEvent, tag="response.cancel"):
    response_id: str | None = None


class OutputAudioClear(ClientEvent, tag="output_audio_buffer.clear"):
    pass


class BargeIn(ClientEvent, tag="barge_in"):
    pass


class TurnSignal(ClientEvent, tag="turn.signal"):
    event: Literal["barge_in"] = "barge_in"


class PlaybackAck(ClientEvent, tag="playback.ack"):
    played_ms: NonNegFloat = 0.0
    committed_ms: NonNegFloat | None = None
    truncate: bool = False
    response_id: str | None = None
    item_id: str | None = None


AnyClientEvent = Union[
    SessionUpdateEvent,
    SessionHeartbeat,
    SessionEventAck,
    SessionClose,
    SessionResume,
    InputAudioAppend,
    InputAudioCommit,
    InputCommit,
    InputAudioClear,
    InputCancel,
    InputTextAppend,
    ItemCreate,
    ItemRetrieve,
    ItemDelete,
    ItemTruncate,
    ResponseCreate,
    ResponseCancel,
    OutputAudioClear,
    BargeIn,
    TurnSignal,
    PlaybackAck,
]

CLIENT_EVENT_TYPES: dict[str, type[ClientEvent]] = {
    cls.__struct_config__.tag: cls for cls in typing.get_args(AnyClientEvent)
}

__all__ = [
    "AnyClientEvent",
    "CLIENT_EVENT_TYPES",
    "ClientEvent",
    "InputTranscription",
    "TurnDetection",
]
