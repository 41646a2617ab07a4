"""semantic_vad end to end: a person's recorded sentence streamed in real
time to the cascade, its turns ended by Smart Turn v3.2 rather than by
silence alone, and the model's word on every pause in the session's log.

The sentence is LibriVox's "had he married a more amiable woman he might
have been made still more respectable than he was" (duplex_bench/
recorded_speech.py); the pause is cut into it two thirds of the way in.
"""

from __future__ import annotations

import asyncio

import pytest

from duplex_bench import recorded_speech
from duplex_server.audio import resample_pcm16
from duplex_server.sessions.core.records import DecisionBody
from tests.e2e.test_voice import RATE, stream_paced
from tests.scrape import grew, scrape
from tests.speech import silence
from tests.wsclient import WsClient

LEAD_MS = 1000
PAUSE_MS = 700  # mid-sentence: longer than server VAD's 500 ms
TAIL_MS = 1500
SENTENCE = "amiable_woman"
CUT_S = 3.85  # a quiet gap between two words, two thirds into the speech


@pytest.fixture(scope="module")
def sentence() -> recorded_speech.Utterance:
    directory = recorded_speech.ensure(recorded_speech.default_dir())
    return next(u for u in recorded_speech.load(directory) if u.name == SENTENCE)


def at_session_rate(pcm16: bytes) -> bytes:
    return resample_pcm16(pcm16, recorded_speech.SAMPLE_RATE_HZ, RATE)


def paused_sentence(utterance: recorded_speech.Utterance) -> tuple[bytes, float]:
    """The sentence with a pause cut into it, at the session's rate; where
    (ms on the input timeline) the pause begins."""
    at = int(CUT_S * recorded_speech.SAMPLE_RATE_HZ) * 2
    before, after = at_session_rate(utterance.pcm16[:at]), at_session_rate(utterance.pcm16[at:])
    audio = silence(LEAD_MS) + before + silence(PAUSE_MS) + after + silence(TAIL_MS)
    return audio, LEAD_MS + len(before) / 2 / RATE * 1000


async def turn_session(server, detection: dict) -> tuple[WsClient, str]:
    """A session whose turns are committed and not answered, so only the
    turn detection decides what happens."""
    client, created = await server.open()
    await client.send(
        {
            "type": "session.update",
            "session": {"turn_detection": {**detection, "create_response": False}},
        }
    )
    await client.expect("session.updated")
    return client, created["session"]["id"]


async def turns_heard(server, detection: dict, audio: bytes) -> tuple[list[dict], list]:
    """Stream ``audio``; every event up to the moment the server has heard
    all of it (the heartbeat is answered after the appends before it), and
    the session's log."""
    client, session_id = await turn_session(server, detection)
    await stream_paced(client, audio)
    await client.send({"type": "session.heartbeat"})
    events = await client.recv_until("session.heartbeat_ack", timeout=30)
    records = await server.app.state.log.read(session_id)
    await client.close()
    return events, records


def judged(records: list) -> list[DecisionBody]:
    return [
        r.body
        for r in records
        if isinstance(r.body, DecisionBody) and r.body.action == "turn_judged"
    ]


def of_type(events: list[dict], event_type: str) -> list[dict]:
    return [e for e in events if e["type"] == event_type]


async def test_a_pause_mid_sentence_ends_the_turn_only_under_server_vad(voice_server, sentence):
    audio, pause_at_ms = paused_sentence(sentence)
    (semantic, semantic_log), (server, _) = await asyncio.gather(
        turns_heard(voice_server, {"type": "semantic_vad"}, audio),
        turns_heard(voice_server, {"type": "server_vad", "silence_duration_ms": 500}, audio),
    )
    # server_vad: the 700 ms of silence ends a turn mid-sentence.
    stops = of_type(server, "input_audio_buffer.speech_stopped")
    assert len(of_type(server, "input_audio_buffer.committed")) == 2
    assert abs(stops[0]["audio_end_ms"] - pause_at_ms) <= 150
    # semantic_vad: the model hears an unfinished sentence at the pause, the
    # turn stays open, and the whole sentence is one turn.
    assert len(of_type(semantic, "input_audio_buffer.speech_started")) == 1
    (stopped,) = of_type(semantic, "input_audio_buffer.speech_stopped")
    assert len(of_type(semantic, "input_audio_buffer.committed")) == 1
    assert stopped["audio_end_ms"] > pause_at_ms + PAUSE_MS
    first, *_, last = judged(semantic_log)
    assert first.reason == "unfinished" and first.probability is not None
    assert first.probability < 0.5 and abs(first.audio_ms - pause_at_ms) <= 150
    assert last.reason == "finished" and last.probability is not None and last.probability >= 0.5
    assert last.audio_ms == stopped["audio_end_ms"]


async def test_the_end_of_a_sentence_ends_the_turn(voice_server, sentence):
    before = await scrape(voice_server.http_url)
    audio = silence(LEAD_MS) + at_session_rate(sentence.pcm16) + silence(TAIL_MS)
    events, records = await turns_heard(
        voice_server, {"type": "semantic_vad", "eagerness": "low"}, audio
    )
    (stopped,) = of_type(events, "input_audio_buffer.speech_stopped")
    (committed,) = of_type(events, "input_audio_buffer.committed")
    assert committed["item_id"] == stopped["item_id"]
    (verdict,) = judged(records)
    assert verdict.reason == "finished" and verdict.probability is not None
    assert verdict.probability >= 0.7  # low eagerness's threshold
    speech_end_ms = LEAD_MS + sentence.speech_end_s * 1000
    assert abs(stopped["audio_end_ms"] - speech_end_ms) <= 150
    # The commit came at the pause that asked the model, not the longest wait.
    stop_at = next(
        r.body.audio_ms
        for r in records
        if isinstance(r.body, DecisionBody) and r.body.action == "speech_stopped"
    )
    assert stop_at == stopped["audio_end_ms"]
    after = await scrape(voice_server.http_url)
    assert grew(before, after, "duplex_stage_seconds", "duplex_stage_seconds_count", stage="turn")
    depth = ("duplex_engine_queue_depth", (("engine", "smart_turn"),))
    assert after["duplex_engine_queue_depth"][depth] == 0  # served, nothing left waiting


async def test_an_unknown_eagerness_is_refused_naming_it(voice_server):
    client, _ = await voice_server.open()
    await client.send(
        {
            "type": "session.update",
            "event_id": "eager",
            "session": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}},
        }
    )
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"], error["event_id"]) == (
        "invalid_event",
        "session.turn_detection.eagerness",
        "eager",
    )
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")  # the session keeps serving
    await client.close()
