"""Speech over the answer without server VAD (the echo model has none): each
decision comes from the client's per-append hints or, with none, from the
audio's energy, under the session's own thresholds; each is logged and told
as ``overlap.decision``."""

from __future__ import annotations

import pytest

from duplex_server.sessions.core.turns import HintedOverlap
from tests.wsclient import WsClient, tone_pcm16

CHUNK_MS = 100


async def answering(server, **session) -> tuple[WsClient, str]:
    """A session whose (slow) answer is playing; its response id."""
    client, _ = await server.open()
    settings = {"extra_body": {"chunk_delay_ms": 200}, **session}
    await client.send({"type": "session.update", "session": settings})
    await client.expect("session.updated")
    await client.append(tone_pcm16(2000))
    await client.send({"type": "input_audio_buffer.commit"})
    created = (await client.recv_until("response.created"))[-1]
    return client, created["response"]["id"]


async def speak_over(client: WsClient, chunks: list[dict]) -> dict:
    for fields in chunks:
        await client.append(fields.pop("pcm", tone_pcm16(CHUNK_MS)), **fields)
    events = await client.recv_until("overlap.decision")
    return events[-1]


async def test_hinted_speech_that_lasts_takes_the_floor(server):
    client, response_id = await answering(server, overlap_barge_in_ms=300)
    decision = await speak_over(client, [{"is_speech": True} for _ in range(3)])
    assert (decision["action"], decision["response_id"]) == ("barge_in", response_id)
    assert decision["metadata"]["overlap_ms"] == 300.0
    assert decision["policy"] == "barge_in_on_speech"
    done = (await client.recv_until("response.done"))[-1]
    assert done["response"]["status"] == "cancelled"


async def test_a_short_hinted_remark_is_dropped(server):
    client, response_id = await answering(
        server, extra_body={"chunk_delay_ms": 200, "overlap_short_ack_ms": 300}
    )
    decision = await speak_over(client, [{"speech_probability": 0.9}, {"speech_probability": 0.1}])
    assert (decision["action"], decision["metadata"]["overlap_ms"]) == ("drop", 100.0)
    assert (await client.expect("input_audio_buffer.cleared"))["type"]  # not a turn


async def test_listen_only_keeps_listening_to_sustained_speech(server):
    client, _ = await answering(server, overlap_policy="listen_only", overlap_barge_in_ms=200)
    decision = await speak_over(client, [{"speech": True}, {"speech": True}])
    assert (decision["action"], decision["policy"]) == ("listen", "listen_only")


@pytest.mark.parametrize(
    ("hint", "action"),
    [
        ({"force_listen": True}, "listen"),
        ({"force_barge_in": True}, "barge_in"),
        ({"overlap_action": "drop"}, "drop"),
    ],
)
async def test_a_forced_decision_is_taken_at_once(server, hint, action):
    client, _ = await answering(server)
    decision = await speak_over(client, [{"is_speech": False, **hint}])
    assert decision["action"] == action


async def test_without_hints_the_energy_decides(server):
    """Silence under ``overlap_silence_rms`` is not speech; a loud tone is."""
    client, _ = await answering(server, overlap_barge_in_ms=200, overlap_silence_rms=0.1)
    quiet = tone_pcm16(CHUNK_MS, amp=1000)  # RMS ~0.02 of full scale
    loud = tone_pcm16(CHUNK_MS, amp=16000)  # RMS ~0.35
    decision = await speak_over(client, [{"pcm": quiet}] * 3 + [{"pcm": loud}, {"pcm": loud}])
    assert (decision["action"], decision["metadata"]["overlap_ms"]) == ("barge_in", 200.0)


async def test_hints_that_contradict_each_other_are_refused(server):
    client, _ = await server.open()
    await client.append(tone_pcm16(CHUNK_MS), force_listen=True, force_barge_in=True, event_id="h1")
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"], error["event_id"]) == (
        "invalid_event",
        "force_listen",
        "h1",
    )


def test_the_judge_drops_short_remarks_and_listens_to_longer_ones():
    judge = HintedOverlap(short_ack_ms=300, barge_in_ms=1000)
    assert judge.push("r1", 100, True, None, True) is None
    assert judge.push("r1", 100, False, None, True) == ("drop", 100)
    for _ in range(4):
        assert judge.push("r1", 100, True, None, True) is None
    assert judge.push("r1", 100, False, None, True) == ("listen", 400)
    assert judge.push("r1", 100, False, None, True) is None  # silence decides nothing
    for _ in range(9):
        judge.push("r1", 100, True, None, True)
    assert judge.push("r1", 100, True, None, True) == ("barge_in", 1000)
    assert judge.push("r1", 100, True, None, True) is None  # decided once per overlap
    assert judge.push("r2", 100, True, None, False) is None  # a new answer starts afresh
