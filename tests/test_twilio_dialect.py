"""Twilio's Media Streams messages read and written (telephony/twilio_dialect.py)
and the marks that stand for playback (telephony/call.PlaybackMarks): pure,
no socket."""

from __future__ import annotations

import json

import pytest

from duplex_server.telephony.call import PlaybackMarks, call_patch
from duplex_server.telephony.carrier import (
    CallAudio,
    CallConnected,
    CallDigit,
    CallMark,
    CallStarted,
    CallStopped,
    CarrierFrameError,
    Ignored,
)
from duplex_server.telephony.twilio_dialect import TwilioDialect
from protocol.session_config import SessionUpdate

TWILIO = TwilioDialect()
START = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": "AC1",
        "streamSid": "MZ1",
        "callSid": "CA1",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"to": "+15550000001", "from": "+15551230000"},
    },
    "streamSid": "MZ1",
}


def parse(frame: dict) -> object:
    return TWILIO.parse(json.dumps(frame))


def test_each_documented_message_is_read():
    assert parse({"event": "connected", "protocol": "Call", "version": "1.0.0"}) == CallConnected()
    started = parse(START)
    assert started == CallStarted(
        "MZ1", "CA1", {"to": "+15550000001", "from": "+15551230000"}, "g711_ulaw", 8000
    )
    media = {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": "/w=="}
    assert parse({"event": "media", "media": media, "streamSid": "MZ1"}) == CallAudio("MZ1", "/w==")
    mark = {"event": "mark", "mark": {"name": "resp_1@20.0"}, "streamSid": "MZ1"}
    assert parse(mark) == CallMark("MZ1", "resp_1@20.0")
    dtmf = {"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": "5"}, "streamSid": "MZ1"}
    assert parse(dtmf) == CallDigit("MZ1", "5")
    stop = {"event": "stop", "streamSid": "MZ1", "stop": {"accountSid": "AC1", "callSid": "CA1"}}
    assert parse(stop) == CallStopped("MZ1")


def test_the_outbound_track_is_ignored_not_heard():
    media = {"track": "outbound", "payload": "/w=="}
    assert isinstance(parse({"event": "media", "media": media, "streamSid": "MZ1"}), Ignored)


@pytest.mark.parametrize(
    "frame",
    [
        "{nope",
        '{"event": "surprise"}',
        json.dumps({**START, "start": {**START["start"], "callSid": ""}}),
        json.dumps(
            {
                **START,
                "start": {
                    **START["start"],
                    "mediaFormat": {"encoding": "audio/l16", "sampleRate": 16000},
                },
            }
        ),
        json.dumps({"event": "media", "media": {"payload": "A" * 20_000}, "streamSid": "MZ1"}),
        json.dumps({"event": "dtmf", "dtmf": {"digit": "55"}, "streamSid": "MZ1"}),
    ],
    ids=["not-json", "unknown-event", "no-call-sid", "not-mulaw", "oversized-media", "two-digits"],
)
def test_what_is_not_twilio_is_refused_by_name(frame):
    with pytest.raises(CarrierFrameError):
        TWILIO.parse(frame)


def test_the_three_outbound_frames_are_twilios():
    assert json.loads(TWILIO.media("MZ1", "/w==")) == {
        "event": "media",
        "streamSid": "MZ1",
        "media": {"payload": "/w=="},
    }
    assert json.loads(TWILIO.mark("MZ1", "m")) == {
        "event": "mark",
        "streamSid": "MZ1",
        "mark": {"name": "m"},
    }
    assert json.loads(TWILIO.clear("MZ1")) == {"event": "clear", "streamSid": "MZ1"}


def test_a_mark_is_the_ack_of_the_audio_before_it_and_a_cleared_answers_marks_are_not():
    marks = PlaybackMarks()
    first = marks.after("resp_1", 20.0)
    second = marks.after("resp_1", 41.66666666666667)  # the session's ms, exactly
    assert marks.played(first).played_ms == 20.0
    ack = marks.played(second)
    assert (ack.response_id, ack.played_ms) == ("resp_1", 41.66666666666667)
    assert marks.played("somebody else's") is None
    assert marks.played("resp_1@not-a-number") is None
    marks.cleared("resp_1")
    assert marks.played(second) is None


def test_a_call_gets_the_carriers_format_and_barge_in_unless_configured():
    configured = SessionUpdate(instructions="hi", input_audio_format="pcm16")
    patch = call_patch(configured, "g711_ulaw")
    assert (patch.input_audio_format, patch.output_audio_format) == ("g711_ulaw", "g711_ulaw")
    assert patch.overlap_policy == "barge_in_on_speech" and patch.instructions == "hi"
    listening = call_patch(SessionUpdate(overlap_policy="listen_only"), "g711_ulaw")
    assert listening.overlap_policy == "listen_only"
