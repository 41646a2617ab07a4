"""Twilio Media Streams, as its documentation spells the messages.

Inbound: ``connected``, ``start`` (stream and call ids, the media format,
the ``<Parameter>`` values the voice webhook set), ``media`` (20 ms of
base64 mu-law at 8 kHz), ``dtmf``, ``mark`` (echoed once the audio before
it played), ``stop``. Outbound on a bidirectional stream: ``media``,
``mark`` and ``clear``, nothing else (Twilio ends a stream that sends
anything else: its error 31924).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from duplex_server.telephony.carrier import (
    CallAudio,
    CallConnected,
    CallDigit,
    CallMark,
    CallStarted,
    CallStopped,
    CarrierFrameError,
    CarrierMessage,
    Ignored,
)
from protocol.audio_formats import G711_ULAW

# Bounds on what Twilio's frames may carry: ids are 34 characters; a media
# frame holds 20 ms (216 base64 characters); parameters are the webhook's.
Sid = Annotated[str, msgspec.Meta(max_length=64)]
Short = Annotated[str, msgspec.Meta(max_length=256)]
MAX_MEDIA_PAYLOAD_CHARS = 16 * 1024  # 1.5 s of mu-law: far above Twilio's 20 ms frames
MAX_PARAMETERS = 32


class MediaFormat(msgspec.Struct):
    encoding: Short = "audio/x-mulaw"
    sampleRate: int = 8000  # noqa: N815 - Twilio's spelling
    channels: int = 1


class StartBody(msgspec.Struct):
    streamSid: Sid = ""  # noqa: N815
    callSid: Sid = ""  # noqa: N815
    accountSid: Sid = ""  # noqa: N815
    tracks: list[Short] = msgspec.field(default_factory=list)
    mediaFormat: MediaFormat = msgspec.field(default_factory=MediaFormat)  # noqa: N815
    customParameters: dict[Short, Short] = msgspec.field(default_factory=dict)  # noqa: N815


class MediaBody(msgspec.Struct):
    payload: Annotated[str, msgspec.Meta(max_length=MAX_MEDIA_PAYLOAD_CHARS)]
    track: Short = "inbound"
    chunk: Short = ""
    timestamp: Short = ""


class MarkBody(msgspec.Struct):
    name: Short


class DtmfBody(msgspec.Struct):
    digit: Annotated[str, msgspec.Meta(min_length=1, max_length=1)]
    track: Short = "inbound_track"


class _Frame(msgspec.Struct, tag_field="event", kw_only=True):
    """What every frame of a started stream carries beside its own body."""

    streamSid: Sid = ""  # noqa: N815 - Twilio's spelling
    sequenceNumber: Short = ""  # noqa: N815


class Connected(msgspec.Struct, tag_field="event", tag="connected"):
    protocol: Short = "Call"
    version: Short = ""


class Start(_Frame, tag="start"):
    start: StartBody


class Media(_Frame, tag="media"):
    media: MediaBody


class Mark(_Frame, tag="mark"):
    mark: MarkBody


class Dtmf(_Frame, tag="dtmf"):
    dtmf: DtmfBody


class Stop(_Frame, tag="stop"):
    pass


Inbound = Connected | Start | Media | Mark | Dtmf | Stop
_DECODER = msgspec.json.Decoder(Inbound)
_ENCODER = msgspec.json.Encoder()
# Twilio's name for its one format, and the server's.
MULAW = "audio/x-mulaw"


class TwilioDialect:
    name = "twilio"
    audio_format = G711_ULAW

    def parse(self, frame: str | bytes) -> CarrierMessage:
        try:
            message = _DECODER.decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CarrierFrameError(str(exc)) from None
        match message:
            case Connected():
                return CallConnected()
            case Start(start=body):
                return _started(body, message.streamSid)
            case Media(media=body) if body.track not in ("inbound", "inbound_track"):
                return Ignored(f"a frame of the {body.track} track")
            case Media(media=body):
                return CallAudio(message.streamSid, body.payload)
            case Mark(mark=body):
                return CallMark(message.streamSid, body.name)
            case Dtmf(dtmf=body):
                return CallDigit(message.streamSid, body.digit)
            case Stop():
                return CallStopped(message.streamSid)
        raise AssertionError(message)  # the decoder's union admits nothing else

    def media(self, stream_id: str, payload: str) -> str:
        frame = {"event": "media", "streamSid": stream_id, "media": {"payload": payload}}
        return _ENCODER.encode(frame).decode()

    def mark(self, stream_id: str, name: str) -> str:
        frame = {"event": "mark", "streamSid": stream_id, "mark": {"name": name}}
        return _ENCODER.encode(frame).decode()

    def clear(self, stream_id: str) -> str:
        return _ENCODER.encode({"event": "clear", "streamSid": stream_id}).decode()


def _started(body: StartBody, outer_sid: str) -> CallStarted:
    stream_id = body.streamSid or outer_sid
    if not stream_id or not body.callSid:
        raise CarrierFrameError("start names no streamSid or callSid")
    fmt = body.mediaFormat
    if (fmt.encoding, fmt.sampleRate, fmt.channels) != (MULAW, 8000, 1):
        raise CarrierFrameError(
            f"start's mediaFormat is {fmt.encoding} at {fmt.sampleRate} Hz, {fmt.channels} "
            f"channel(s); Twilio streams {MULAW} at 8000 Hz, mono"
        )
    if len(body.customParameters) > MAX_PARAMETERS:
        raise CarrierFrameError(f"start carries more than {MAX_PARAMETERS} parameters")
    return CallStarted(stream_id, body.callSid, dict(body.customParameters), G711_ULAW, 8000)
