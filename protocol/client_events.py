"""Client -> server events (PROTOCOL.md, "Client -> server").

One Struct per event type, discriminated by ``type``. Native ``/v1/duplex``
command names are subclasses carrying another tag, so handlers see one class.
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal, Union

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocol.errors import ProtocolError
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

    @property
    def type(self) -> str:
        """The event's ``type`` as the client spelled it (its struct's tag)."""
        return str(type(self).__struct_config__.tag)


class SessionUpdateEvent(ClientEvent, tag="session.update"):
    session: SessionUpdate = msgspec.field(default_factory=SessionUpdate)


class TranscriptionSessionUpdate(SessionUpdateEvent, tag="transcription_session.update"):
    """OpenAI's beta spelling of a ``session.update`` of type transcription
    (its fields are the beta session's: ``input_audio_format``,
    ``input_audio_transcription``, ``turn_detection``,
    ``input_audio_noise_reduction``, ``include``); answered with
    ``transcription_session.updated``. A ``session.type`` other than
    transcription contradicts the event and is refused."""

    def __post_init__(self) -> None:
        if self.session.type is UNSET:
            self.session.type = "transcription"
        elif self.session.type != "transcription":
            raise ValueError("transcription_session.update is for a transcription session")


class SessionHeartbeat(ClientEvent, tag="session.heartbeat"):
    pass


class SessionEventAck(ClientEvent, tag="session.event_ack"):
    server_event_seq: NonNegInt = 0


class SessionClose(ClientEvent, tag="session.close"):
    # Why the client is leaving: logged and echoed in session.closed's ``detail``.
    reason: Annotated[str, Meta(max_length=256)] | None = None


class CloseSession(SessionClose, tag="close_session"):
    """vLLM-Omni's spelling of ``session.close``."""


class Close(SessionClose, tag="close"):
    """vLLM-Omni's short spelling of ``session.close``."""


class SessionResume(ClientEvent, tag="session.resume"):
    session_id: str = ""
    resume_token: str = ""
    last_received_server_event_seq: NonNegInt = 0


AppendRate = Annotated[int, Meta(gt=0, le=384_000)]
OverlapAction = Literal["drop", "listen", "barge_in"]


def one_of(*spellings: tuple[object, str]) -> object:
    """The value of a field a client may spell several ways (vLLM-Omni's and
    OpenAI's): None if none was sent; two that disagree are refused
    (``invalid_event`` naming the second; the caller adds the event id)."""
    sent = [(value, name) for value, name in spellings if value is not None]
    for value, name in sent[1:]:
        if value != sent[0][0]:
            raise ProtocolError(
                "invalid_event",
                f"{name} ({value!r}) contradicts {sent[0][1]} ({sent[0][0]!r})",
                param=name,
            )
    return sent[0][0] if sent else None


class InputAudioAppend(ClientEvent, tag="input_audio_buffer.append"):
    """Audio, with what the client knows of it. Every field is honoured or
    refused: a format, rate or duration the audio contradicts is refused
    (``invalid_audio``), never silently read another way."""

    audio: str = ""
    format: AudioFormatSpec | None = None
    input_audio_format: AudioFormatSpec | None = None  # vLLM-Omni's spelling of format
    sample_rate_hz: AppendRate | None = None
    sample_rate: AppendRate | None = None
    duration_ms: NonNegFloat | None = None
    audio_duration_ms: NonNegFloat | None = None
    audio_start_ms: NonNegFloat | None = None
    audio_end_ms: NonNegFloat | None = None
    is_speech: bool | None = None
    speech: bool | None = None
    speech_probability: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    transcript: Annotated[str, Meta(max_length=4096)] | None = None
    # Overlap hints (PROTOCOL.md, "Overlap"): what to do with this speech if
    # the assistant is talking.
    force_listen: bool | None = None
    force_barge_in: bool | None = None
    overlap_action: OverlapAction | None = None
    video_frames: list[str] = msgspec.field(default_factory=list)

    def format_named(self) -> AudioFormatSpec | None:
        return one_of((self.format, "format"), (self.input_audio_format, "input_audio_format"))  # type: ignore[return-value]

    def rate_named(self) -> int | None:
        return one_of((self.sample_rate_hz, "sample_rate_hz"), (self.sample_rate, "sample_rate"))  # type: ignore[return-value]

    def duration_named(self) -> float | None:
        return one_of(  # type: ignore[return-value]
            (self.duration_ms, "duration_ms"), (self.audio_duration_ms, "audio_duration_ms")
        )

    def hint_named(self) -> OverlapAction | None:
        """What the client asks be done with this speech if the assistant is
        talking: ``overlap_action``, or ``force_barge_in`` / ``force_listen``."""
        forced = [
            (action, name)
            for action, name in (
                (self.overlap_action, "overlap_action"),
                ("barge_in" if self.force_barge_in else None, "force_barge_in"),
                ("listen" if self.force_listen else None, "force_listen"),
            )
            if action is not None
        ]
        return one_of(*forced)  # type: ignore[return-value]

    def speech_named(self) -> bool | None:
        """Whether the client says this is speech: either flag, else its
        probability against one half."""
        said = one_of((self.is_speech, "is_speech"), (self.speech, "speech"))
        if said is None and self.speech_probability is not None:
            return self.speech_probability >= 0.5
        return said  # type: ignore[return-value]


class InputAudioCommit(ClientEvent, tag="input_audio_buffer.commit"):
    final: bool | None = None
    response_create: bool | None = None
    create_response: bool | None = None  # the same, as OpenAI's turn_detection spells it
    is_speech: bool | None = None

    def respond_named(self) -> bool | None:
        return one_of(  # type: ignore[return-value]
            (self.response_create, "response_create"), (self.create_response, "create_response")
        )


class InputCommit(InputAudioCommit, tag="input.commit"):
    """Native spelling of ``input_audio_buffer.commit``."""


class InputAudioClear(ClientEvent, tag="input_audio_buffer.clear"):
    pass


class InputCancel(ClientEvent, tag="input.cancel"):
    pass


class InputTextAppend(ClientEvent, tag="input.text.append"):
    text: str = ""


class InputTextAppendAlias(InputTextAppend, tag="input_text.append"):
    """vLLM-Omni's spelling of ``input.text.append``."""


class PushText(InputTextAppend, tag="push_text"):
    """vLLM-Omni's streaming-text spelling of ``input.text.append``."""


class InputDtmf(ClientEvent, tag="input.dtmf", kw_only=True):
    """A telephone key the user pressed (a carrier's DTMF, a page's keypad);
    ``digit`` is required (kw_only: after the base's defaulted fields)."""

    digit: Literal["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "*", "#", "A", "B", "C", "D"]


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
    response_id: str | None = None  # the response to cut; another one: response_not_found


class BargeIn(ClientEvent, tag="barge_in"):
    pass


# What an external turn signal may carry: the event it stands for, whose
# fields come in ``payload`` (PROTOCOL.md, "Client → server").
SignalledEvent = Literal[
    "barge_in",
    "input.cancel",
    "response.cancel",
    "session.update",
    "conversation.item.create",
    "conversation.item.delete",
    "conversation.item.truncate",
]


class TurnSignal(ClientEvent, tag="turn.signal"):
    event: SignalledEvent = "barge_in"
    payload: dict[str, object] = msgspec.field(default_factory=dict)


class SignalTurn(TurnSignal, tag="signal_turn"):
    """vLLM-Omni's spelling of ``turn.signal``."""


class PlaybackAck(ClientEvent, tag="playback.ack"):
    played_ms: NonNegFloat = 0.0
    committed_ms: NonNegFloat | None = None
    truncate: bool = False
    response_id: str | None = None
    item_id: str | None = None


class AudioPlaybackAck(PlaybackAck, tag="audio.playback_ack"):
    """vLLM-Omni's spelling of ``playback.ack``."""


AnyClientEvent = Union[
    SessionUpdateEvent,
    TranscriptionSessionUpdate,
    SessionHeartbeat,
    SessionEventAck,
    SessionClose,
    CloseSession,
    Close,
    SessionResume,
    InputAudioAppend,
    InputAudioCommit,
    InputCommit,
    InputAudioClear,
    InputCancel,
    InputTextAppend,
    InputTextAppendAlias,
    PushText,
    InputDtmf,
    ItemCreate,
    ItemRetrieve,
    ItemDelete,
    ItemTruncate,
    ResponseCreate,
    ResponseCancel,
    OutputAudioClear,
    BargeIn,
    TurnSignal,
    SignalTurn,
    PlaybackAck,
    AudioPlaybackAck,
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
