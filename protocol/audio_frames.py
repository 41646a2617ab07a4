"""Binary audio frames on the duplex wire (PROTOCOL.md, "Binary audio").

A socket that asks for them (``?audio=binary`` on the duplex endpoint) sends
its audio as WebSocket binary frames instead of base64 in JSON, and gets the
answer's audio the same way. A frame is a fixed 24-byte little-endian header
and the raw audio:

====== ===== ===========================================================
offset bytes field
====== ===== ===========================================================
0      1     magic ``0xDA``
1      1     version, ``1``
2      1     kind: ``1`` input append (client to server), ``2`` output delta
3      1     format: ``1`` pcm16, ``2`` pcm_f32le, ``3`` g711_ulaw,
             ``4`` g711_alaw, ``5`` opus
4      1     flags: bit 0 the speech flag is given, bit 1 its value
5      3     reserved, zero
8      4     sample rate in Hz (0: the format's or session's own)
12     4     duration in microseconds (0: not declared)
16     8     sequence: an input frame's own number (its ``event_id`` is
             ``audio_<seq>``; 0: none); an output frame's ``server_event_seq``
====== ===== ===========================================================

An input frame *is* an ``input_audio_buffer.append`` (:func:`as_append`):
the session applies, logs and refuses it exactly as that JSON event. An
output frame follows its ``response.output_audio.delta`` event at once; the
event keeps every field but ``delta``, which is empty (:func:`split_delta`),
so acks and resume cursors are the JSON events' own.
"""

from __future__ import annotations

import binascii
import enum
import struct

import msgspec

from protocol.audio_formats import G711_ALAW, G711_ULAW, OPUS, PCM16, PCM_F32LE
from protocol.client_events import InputAudioAppend
from protocol.dialect import event_type
from protocol.errors import ProtocolError
from protocol.server_events import AudioDelta, OutputAudioDelta

MAGIC = 0xDA
VERSION = 1
HEADER = struct.Struct("<BBBBB3sIIQ")
HEADER_BYTES = HEADER.size  # 24
_RESERVED = b"\x00\x00\x00"

SPEECH_GIVEN = 0x01
SPEECH_TRUE = 0x02
_FLAGS = SPEECH_GIVEN | SPEECH_TRUE

MAX_RATE_HZ = 384_000  # an append's sample_rate_hz bound (client_events.AppendRate)


class FrameKind(enum.IntEnum):
    INPUT_APPEND = 1
    OUTPUT_DELTA = 2


FORMAT_CODES: dict[str, int] = {PCM16: 1, PCM_F32LE: 2, G711_ULAW: 3, G711_ALAW: 4, OPUS: 5}
FORMAT_NAMES: dict[int, str] = {code: name for name, code in FORMAT_CODES.items()}


class AudioFrame(msgspec.Struct, frozen=True):
    """One binary frame, header fields and payload."""

    kind: FrameKind
    format: str
    sequence: int
    payload: bytes
    sample_rate_hz: int = 0
    duration_us: int = 0
    is_speech: bool | None = None


def pack(frame: AudioFrame) -> bytes:
    """The frame's bytes: header, then payload."""
    flags = 0 if frame.is_speech is None else SPEECH_GIVEN | (SPEECH_TRUE * frame.is_speech)
    head = HEADER.pack(
        MAGIC,
        VERSION,
        frame.kind,
        FORMAT_CODES[frame.format],
        flags,
        _RESERVED,
        frame.sample_rate_hz,
        frame.duration_us,
        frame.sequence,
    )
    return head + frame.payload


def _refuse(message: str, param: str, sequence: int = 0) -> ProtocolError:
    return ProtocolError(
        "invalid_audio_frame",
        message,
        param=f"frame.{param}",
        event_id=append_event_id(sequence),
    )


def unpack(data: bytes, max_bytes: int) -> AudioFrame:
    """A binary frame read back; ProtocolError (``invalid_audio_frame`` with
    ``param`` naming the header field, or ``payload_too_large``) if it is
    not one this version reads."""
    if len(data) > max_bytes:
        raise ProtocolError(
            "payload_too_large",
            f"binary frame of {len(data)} bytes exceeds the limit of {max_bytes} bytes",
            param="frame",
        )
    if len(data) < HEADER_BYTES:
        raise _refuse(
            f"a binary frame starts with a {HEADER_BYTES}-byte header; this one has "
            f"{len(data)} bytes",
            "header",
        )
    magic, version, kind, code, flags, reserved, rate, duration_us, sequence = HEADER.unpack_from(
        data
    )
    if magic != MAGIC:
        raise _refuse(f"bad magic byte 0x{magic:02x} (expected 0x{MAGIC:02x})", "magic")
    if version != VERSION:
        raise _refuse(f"binary frame version {version} is not served (only {VERSION})", "version")
    if kind not in (FrameKind.INPUT_APPEND, FrameKind.OUTPUT_DELTA):
        raise _refuse(f"unknown frame kind {kind}", "kind", sequence)
    name = FORMAT_NAMES.get(code)
    if name is None:
        raise _refuse(f"unknown format code {code}", "format", sequence)
    if flags & ~_FLAGS or reserved != _RESERVED:
        raise _refuse("reserved header bits must be zero", "flags", sequence)
    if rate > MAX_RATE_HZ:
        raise _refuse(f"sample rate {rate} Hz is beyond {MAX_RATE_HZ} Hz", "sample_rate", sequence)
    return AudioFrame(
        kind=FrameKind(kind),
        format=name,
        sequence=sequence,
        payload=data[HEADER_BYTES:],
        sample_rate_hz=rate,
        duration_us=duration_us,
        is_speech=bool(flags & SPEECH_TRUE) if flags & SPEECH_GIVEN else None,
    )


def append_event_id(sequence: int) -> str | None:
    """The ``event_id`` an input frame's append carries (idempotency key,
    echoed in its refusals); None for sequence 0."""
    return f"audio_{sequence}" if sequence else None


def as_append(frame: AudioFrame) -> InputAudioAppend:
    """The ``input_audio_buffer.append`` an input frame is: from here on the
    session cannot tell the two apart (same checks, records and refusals)."""
    if frame.kind is not FrameKind.INPUT_APPEND:
        raise _refuse("a client sends input frames (kind 1) only", "kind", frame.sequence)
    return InputAudioAppend(
        event_id=append_event_id(frame.sequence),
        audio=binascii.b2a_base64(frame.payload, newline=False).decode("ascii"),
        format=frame.format,
        sample_rate_hz=frame.sample_rate_hz or None,
        duration_ms=frame.duration_us / 1000 if frame.duration_us else None,
        is_speech=frame.is_speech,
    )


def read_append(data: bytes, max_bytes: int) -> InputAudioAppend:
    """A client's binary frame as the append it is (ProtocolError: why not)."""
    return as_append(unpack(data, max_bytes))


DELTA_TYPES = frozenset({b"response.output_audio.delta", b"response.audio.delta"})
_DELTA_KEY = b',"delta":"'
_delta_decoder = msgspec.json.Decoder(OutputAudioDelta | AudioDelta)


def split_delta(payload: bytes) -> tuple[bytes, bytes] | None:
    """An encoded audio delta event as a binary-audio socket gets it: the
    event with an empty ``delta``, and the binary frame carrying the audio
    (its sequence the event's ``server_event_seq``); None for any other event.

    The payload is this server's own encoding (msgspec: no spaces, the
    ``delta`` key before ``metadata``), and base64 has no quote, so the
    audio is cut out of the bytes as they are."""
    if event_type(payload) not in DELTA_TYPES:
        return None
    start = payload.find(_DELTA_KEY)
    if start < 0:
        return None
    begin = start + len(_DELTA_KEY)
    end = payload.find(b'"', begin)
    audio = binascii.a2b_base64(payload[begin:end])
    text = payload[:begin] + payload[end:]
    event = _delta_decoder.decode(text)
    meta = event.metadata
    frame = AudioFrame(
        kind=FrameKind.OUTPUT_DELTA,
        format=event.format,
        sequence=event.server_event_seq or 0,
        payload=audio,
        sample_rate_hz=event.sample_rate_hz,
        duration_us=round(meta.audio_duration_ms * 1000) if meta is not None else 0,
    )
    return text, pack(frame)
