"""The client's demultiplexer on recorded streams: no sockets, exact replays."""

from __future__ import annotations

import json

import pytest

from clients.duplex.demux import Demux
from clients.duplex.errors import DuplexProtocolError
from protocol import server_events as se


def recorded_turn(first_seq: int = 1) -> list[str]:
    """A turn as the server journals it: GA and beta twins, one audio chunk."""
    frames = []
    seq = first_seq

    def add(event: dict) -> None:
        nonlocal seq
        frames.append(json.dumps({"server_event_seq": seq, "event_id": f"e{seq}", **event}))
        seq += 1

    response = {
        "id": "r1",
        "status": "in_progress",
        "status_details": None,
        "output": [],
        "modalities": ["audio"],
        "output_modalities": ["audio"],
        "metadata": None,
    }
    add({"type": "response.created", "response": response})
    for kind in ("response.output_audio.delta", "response.audio.delta"):
        add({"type": kind, "response_id": "r1", "delta": "AAABAA=="})
    for kind in ("response.output_audio_transcript.delta", "response.audio_transcript.delta"):
        add({"type": kind, "response_id": "r1", "delta": "hello"})
    add({"type": "response.done", "response": {**response, "status": "completed"}})
    return frames


def feed_all(demux: Demux, frames: list[str]) -> list[se.ServerEvent]:
    return [e for e in (demux.feed(f) for f in frames) if e is not None]


def test_twins_collapse_to_ga_and_response_is_tracked():
    demux = Demux()
    events = feed_all(demux, recorded_turn())
    assert [type(e) for e in events] == [
        se.ResponseCreated,
        se.OutputAudioDelta,
        se.OutputAudioTranscriptDelta,
        se.ResponseDone,
    ]
    view = demux.responses["r1"]
    assert view.status == "completed" and view.transcript == "hello"
    assert view.audio == [b"\x00\x00\x01\x00"]
    assert demux.last_seq == 6


def test_replayed_events_are_dropped_once_a_resume_is_expected():
    demux = Demux()
    frames = recorded_turn()
    feed_all(demux, frames[:4])
    demux.expect_replay(demux.last_seq)
    again = feed_all(demux, frames[2:])  # the server replays from an older cursor
    assert [type(e) for e in again] == [se.ResponseDone]
    assert demux.responses["r1"].transcript == "hello"  # not doubled


def test_backwards_seq_outside_a_replay_is_a_protocol_error():
    demux = Demux()
    frames = recorded_turn()
    feed_all(demux, frames[:3])
    with pytest.raises(DuplexProtocolError, match="backwards"):
        demux.feed(frames[1])


def test_out_of_order_delivery_is_refused():
    demux = Demux()
    frames = recorded_turn()
    demux.feed(frames[2])
    with pytest.raises(DuplexProtocolError):
        demux.feed(frames[0])


def test_attachment_scoped_events_carry_no_seq_and_pass():
    demux = Demux()
    feed_all(demux, recorded_turn())
    event = demux.feed(json.dumps({"type": "session.resumed", "server_event_seq": None}))
    assert isinstance(event, se.SessionResumed) and demux.last_seq == 6


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{not json", "invalid_json"),
        (json.dumps({"type": "response.teleport", "server_event_seq": 1}), "invalid_event"),
        (json.dumps({"type": "response.done", "response": 7}), "invalid_event"),
    ],
)
def test_malformed_frames(frame, code):
    with pytest.raises(DuplexProtocolError) as err:
        Demux().feed(frame)
    assert err.value.code == code


def server_stream() -> list[bytes]:
    """The exact frames the server journaled for a scripted conversation."""
    from duplex_server.sessions.core.records import OutBody
    from tests.test_fold import conversation

    return [r.body.payload for r in conversation().log if isinstance(r.body, OutBody)]


def test_a_stream_journaled_by_the_server():
    frames = server_stream()
    demux = Demux()
    events = feed_all(demux, frames)
    assert len(events) < len(frames)  # beta twins collapsed
    (view,) = demux.responses.values()
    assert view.status == "completed" and view.transcript == "one two"
    assert view.generated_ms == 200.0 and view.played_ms == 150.0
    # A resume from the middle replays the tail: nothing is processed twice.
    demux.expect_replay(demux.last_seq)
    assert feed_all(demux, frames[len(frames) // 2 :]) == []


def test_listen_decision_is_tracked_as_a_completed_view():
    from clients.duplex.demux import listen_key

    demux = Demux()
    event = demux.feed(
        json.dumps(
            {"type": "response.listen", "server_event_seq": 4, "reason": "client_declared_silence"}
        )
    )
    assert isinstance(event, se.ResponseListen)
    view = demux.responses[listen_key(event)]
    assert (view.response_id, view.decision, view.done) == ("listen_4", "listen", True)
