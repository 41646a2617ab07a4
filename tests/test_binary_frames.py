"""The binary audio frame header (protocol/audio_frames.py): pack, unpack,
what a malformed frame is refused with, and the events frames stand for."""

from __future__ import annotations

import base64
import struct

import msgspec
import pytest

from protocol import server_events as se
from protocol.audio_frames import (
    FORMAT_CODES,
    HEADER_BYTES,
    MAGIC,
    AudioFrame,
    FrameKind,
    as_append,
    pack,
    read_append,
    split_delta,
    unpack,
)
from protocol.client_events import InputAudioAppend
from protocol.codec import FrameDecoder, encode_server_event
from protocol.errors import ProtocolError

LIMIT = 1 << 20


def frame(**fields) -> AudioFrame:
    base = dict(kind=FrameKind.INPUT_APPEND, format="pcm16", sequence=7, payload=b"\x01\x02" * 40)
    return AudioFrame(**{**base, **fields})


def test_the_header_is_24_little_endian_bytes():
    data = pack(frame(sample_rate_hz=16_000, duration_us=2_500, is_speech=True))
    assert HEADER_BYTES == 24 and len(data) == 24 + 80
    assert data[:5] == bytes([MAGIC, 1, 1, FORMAT_CODES["pcm16"], 0b11]) and data[5:8] == b"\0\0\0"
    assert struct.unpack_from("<IIQ", data, 8) == (16_000, 2_500, 7)
    assert data[24:] == b"\x01\x02" * 40


@pytest.mark.parametrize("fmt", sorted(FORMAT_CODES))
@pytest.mark.parametrize("speech", [None, True, False])
@pytest.mark.parametrize("kind", list(FrameKind))
def test_pack_and_unpack_round_trip(fmt, speech, kind):
    original = frame(
        kind=kind,
        format=fmt,
        is_speech=speech,
        sample_rate_hz=48_000,
        duration_us=20_000,
        sequence=2**64 - 1,
    )
    assert unpack(pack(original), LIMIT) == original


def test_an_empty_payload_is_a_frame():
    assert unpack(pack(frame(payload=b"")), LIMIT).payload == b""


def refusal(data: bytes, limit: int = LIMIT) -> ProtocolError:
    with pytest.raises(ProtocolError) as err:
        read_append(data, limit)
    return err.value


def test_malformed_frames_are_refused_by_field():
    good = pack(frame())
    cases = {
        "frame.header": good[: HEADER_BYTES - 1],
        "frame.magic": b"\x7b" + good[1:],
        "frame.version": good[:1] + b"\x02" + good[2:],
        "frame.kind": good[:2] + b"\x09" + good[3:],
        "frame.format": good[:3] + b"\x63" + good[4:],
        "frame.flags": good[:4] + b"\x04" + good[5:],
    }
    for param, data in cases.items():
        err = refusal(data)
        assert (err.code, err.param) == ("invalid_audio_frame", param), param
    reserved = refusal(good[:6] + b"\x01" + good[7:])
    assert (reserved.code, reserved.param) == ("invalid_audio_frame", "frame.flags")
    # Once the sequence is read, the refusal names the frame's append.
    assert refusal(cases["frame.format"]).event_id == "audio_7"
    assert refusal(cases["frame.header"]).event_id is None


def test_an_oversize_frame_is_payload_too_large():
    err = refusal(pack(frame(payload=b"\0" * 1000)), limit=1000)
    assert (err.code, err.param) == ("payload_too_large", "frame")


def test_a_client_may_not_send_output_frames():
    err = refusal(pack(frame(kind=FrameKind.OUTPUT_DELTA)))
    assert (err.code, err.param, err.event_id) == ("invalid_audio_frame", "frame.kind", "audio_7")


def test_an_absurd_rate_is_refused_as_the_schema_would():
    err = refusal(pack(frame(sample_rate_hz=10**6)))
    assert (err.code, err.param) == ("invalid_audio_frame", "frame.sample_rate")


def test_an_input_frame_is_the_json_append_it_stands_for():
    pcm = b"\x10\x00" * 2400
    binary = as_append(
        frame(payload=pcm, sample_rate_hz=24_000, duration_us=100_000, is_speech=False)
    )
    text = msgspec.json.encode(
        {
            "type": "input_audio_buffer.append",
            "event_id": "audio_7",
            "audio": base64.b64encode(pcm).decode(),
            "format": "pcm16",
            "sample_rate_hz": 24_000,
            "duration_ms": 100.0,
            "is_speech": False,
        }
    )
    decoded = FrameDecoder().decode(text)
    assert isinstance(decoded, InputAudioAppend) and binary == decoded
    # the same digest: a JSON retry of a binary append is a retry
    assert msgspec.json.encode(binary) == msgspec.json.encode(decoded)


def test_undeclared_fields_stay_absent():
    append = as_append(frame(sequence=0, sample_rate_hz=0, duration_us=0))
    assert (append.event_id, append.sample_rate_hz, append.duration_ms, append.is_speech) == (
        None,
        None,
        None,
        None,
    )


def delta_event(cls=se.OutputAudioDelta, audio: bytes = b"\x01\x00" * 480) -> bytes:
    return encode_server_event(
        cls(
            event_id="event_x_12",
            server_event_seq=12,
            response_id="resp_1",
            item_id="item_resp_1",
            delta=base64.b64encode(audio).decode(),
            format="pcm16",
            sample_rate_hz=24_000,
            metadata=se.AudioDeltaMetadata(
                epoch=0,
                end_of_turn=False,
                audio_duration_ms=20.0,
                audio_text_marks=[],
                playback=se.PlaybackLedger(),
            ),
        )
    )


@pytest.mark.parametrize("cls", [se.OutputAudioDelta, se.AudioDelta])
def test_a_delta_splits_into_its_event_and_its_frame(cls):
    audio = b"\x01\x00" * 480
    payload = delta_event(cls, audio)
    split = split_delta(payload)
    assert split is not None
    text, data = split
    event = msgspec.json.decode(text)
    original = msgspec.json.decode(payload)
    assert event == {**original, "delta": ""}  # every field but the audio, unchanged
    carried = unpack(data, LIMIT)
    assert (carried.kind, carried.format, carried.sequence) == (FrameKind.OUTPUT_DELTA, "pcm16", 12)
    assert (carried.sample_rate_hz, carried.duration_us, carried.payload) == (24_000, 20_000, audio)


def test_other_events_do_not_split():
    done = encode_server_event(se.OutputAudioDone(server_event_seq=3, response_id="r"))
    transcript = encode_server_event(se.OutputAudioTranscriptDelta(server_event_seq=4, delta="hi"))
    assert split_delta(done) is None and split_delta(transcript) is None
