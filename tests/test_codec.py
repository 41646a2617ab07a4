"""The frame decoder's gate, beyond the e2e error table."""

from __future__ import annotations

import json

import pytest

from protocol.client_events import InputAudioAppend, InputCommit, SessionUpdateEvent
from protocol.codec import FrameDecoder
from protocol.errors import ERROR_CLASS, ProtocolError


def test_limit_is_checked_before_parsing():
    decoder = FrameDecoder(max_frame_bytes=10)
    with pytest.raises(ProtocolError) as err:
        decoder.decode("{" * 11)
    assert err.value.code == "payload_too_large"


def test_data_url_frames_are_accepted():
    frame = json.dumps(
        {
            "type": "input_audio_buffer.append",
            "audio": "AAA=",
            "video_frames": ["data:image/jpeg;base64,/9j/4AAQ", "/9j/4AAQ"],
        }
    )
    event = FrameDecoder().decode(frame)
    assert isinstance(event, InputAudioAppend) and len(event.video_frames) == 2


def test_turn_detection_null_differs_from_absent():
    decoder = FrameDecoder()
    null = decoder.decode('{"type":"session.update","session":{"turn_detection":null}}')
    absent = decoder.decode('{"type":"session.update","session":{}}')
    assert isinstance(null, SessionUpdateEvent) and null.session.turn_detection is None
    assert absent.session.turn_detection is not None  # UNSET


def test_native_alias_decodes_to_its_own_class():
    assert isinstance(FrameDecoder().decode('{"type":"input.commit"}'), InputCommit)


def test_unknown_fields_are_ignored_for_forward_compatibility():
    event = FrameDecoder().decode('{"type":"session.heartbeat","future_field":1}')
    assert event.event_id is None


def test_only_documented_codes_exist():
    with pytest.raises(ValueError):
        ProtocolError("made_up_code", "x")
    assert ERROR_CLASS["unauthorized"] == "authentication_error"


@pytest.mark.parametrize("depth", [65, 975, 100_000])
def test_deep_nesting_is_invalid_json_not_a_crash(depth):
    frames = [
        "[" * depth + "]" * depth,
        '{"type":"session.update","session":{"metadata":{"k":' + "[" * depth + "]" * depth + "}}}",
        '{"type":"session.update","session":{"metadata":{"k":' + "[" * depth,  # truncated too
    ]
    for frame in frames:
        with pytest.raises(ProtocolError) as refused:
            FrameDecoder().decode(frame)
        assert refused.value.code == "invalid_json"


def test_nesting_within_the_limit_and_brackets_in_text_are_fine():
    nested = "[" * 60 + "]" * 60
    frame = '{"type":"session.update","session":{"x_future_field":{"k":' + nested + "}}}"
    assert isinstance(FrameDecoder().decode(frame), SessionUpdateEvent)
    text = json.dumps({"type": "session.update", "session": {"instructions": "[{" * 500}})
    assert FrameDecoder().decode(text).session.instructions == "[{" * 500
