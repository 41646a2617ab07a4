"""``WS /v1/audio/speech/stream``: text in, speech out, sentence by sentence.

Client frames are JSON text: ``session.config`` (optional, sticky: it holds
for every later utterance; refused while an utterance is open),
``input.text`` (a fragment), ``input.done`` (ends the utterance: what is
buffered is spoken, the socket stays open), ``session.close``. The server
answers each piece of speech with ``audio.start``, binary frames of audio,
``audio.done``; then ``utterance.done`` once an utterance is all spoken,
``session.done`` before it closes, and ``error`` for anything refused.
The field names follow vLLM-Omni's streaming speech socket."""

from __future__ import annotations

import re
from typing import Literal, Union

import msgspec

from protocol.codec import _param_from
from protocol.errors import ErrorBody, ProtocolError

Granularity = Literal["none", "sentence", "clause"]
StreamFormat = Literal["pcm", "wav"]
MAX_CLIENT_FRAME_BYTES = 64 * 1024
# msgspec names a top-level field without a path: "missing required field `text`".
_TOP_LEVEL_FIELD = re.compile(r"(?:missing required|unknown) field `([^`]*)`")


class SpeechStreamEvent(msgspec.Struct, tag_field="type", forbid_unknown_fields=True):
    pass


class SessionConfig(SpeechStreamEvent, tag="session.config"):
    model: str | None = None
    voice: str | None = None  # None: the synthesiser's default voice
    speed: float = 1.0
    response_format: str = "wav"  # pcm or wav; anything else is refused by name
    sample_rate: int = 24_000
    split_granularity: Granularity = "sentence"


class InputText(SpeechStreamEvent, tag="input.text"):
    text: str


class InputDone(SpeechStreamEvent, tag="input.done"):
    pass


class SessionClose(SpeechStreamEvent, tag="session.close"):
    pass


AnySpeechStreamEvent = Union[SessionConfig, InputText, InputDone, SessionClose]


class SpeechStreamServerEvent(msgspec.Struct, tag_field="type"):
    pass


class AudioStart(SpeechStreamServerEvent, tag="audio.start"):
    """The binary frames after it, up to ``audio.done``, speak ``sentence_text``
    (a ``wav`` sentence is one WAV file across its frames; ``pcm`` is 16-bit
    little-endian mono at ``sample_rate``)."""

    utterance_index: int
    sentence_index: int
    sentence_text: str
    format: StreamFormat
    sample_rate: int


class AudioDone(SpeechStreamServerEvent, tag="audio.done"):
    utterance_index: int
    sentence_index: int
    audio_bytes: int
    duration_ms: int


class UtteranceDone(SpeechStreamServerEvent, tag="utterance.done"):
    """Everything up to one ``input.done`` has been spoken."""

    utterance_index: int
    sentences: int


class SessionDone(SpeechStreamServerEvent, tag="session.done"):
    utterances: int
    total_sentences: int


class StreamError(SpeechStreamServerEvent, tag="error"):
    error: ErrorBody


_decoder = msgspec.json.Decoder(AnySpeechStreamEvent)
_encoder = msgspec.json.Encoder()


def decode_speech_stream_event(frame: str | bytes) -> AnySpeechStreamEvent:
    """A typed client frame, or ProtocolError with the code and param."""
    if len(frame) > MAX_CLIENT_FRAME_BYTES:
        raise ProtocolError(
            "payload_too_large", f"a frame is at most {MAX_CLIENT_FRAME_BYTES} bytes"
        )
    try:
        return _decoder.decode(frame)
    except msgspec.ValidationError as exc:
        message = str(exc)
        code = (
            "unknown_event_type" if "Invalid value" in message and "`$.type`" in message else None
        )
        param = _param_from(message)
        if param is None and (named := _TOP_LEVEL_FIELD.search(message)) is not None:
            param = named.group(1)
        raise ProtocolError(code or "invalid_event", message, param=param) from None
    except msgspec.DecodeError as exc:
        raise ProtocolError("invalid_json", f"frame is not valid JSON: {exc}") from None


def encode_speech_stream_event(event: SpeechStreamServerEvent) -> str:
    return _encoder.encode(event).decode()
