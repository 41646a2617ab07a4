"""Spoken turns end to end: eSpeak speech streamed in real time to the
``cascade`` model, server VAD, recognition, and a spoken answer heard back."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from duplex_server.audio import resample_pcm16
from duplex_server.config import ServerConfig
from duplex_server.engine.audio.sphinx import Sphinx
from tests.conftest import free_port, running_server
from tests.scrape import grew, scrape
from tests.speech import ANSWERS, PHRASES, silence, speak
from tests.wsclient import WsClient

RATE = 24_000
LEAD_MS = 1000.0


def speech_bounds_ms(pcm: bytes) -> tuple[float, float]:
    """Where the synthesised speech is: samples above -50 dBFS (eSpeak's
    output fades in and out rather than starting on digital silence)."""
    loud = np.flatnonzero(np.abs(np.frombuffer(pcm, "<i2")) > 100)
    return loud[0] * 1000 / RATE, (loud[-1] + 1) * 1000 / RATE


async def stream_paced(client: WsClient, pcm: bytes, chunk_ms: int = 100) -> None:
    """Append ``pcm`` in ``chunk_ms`` chunks at the pace a microphone would."""
    step = RATE * chunk_ms // 1000 * 2
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    for at in range(0, len(pcm), step):
        await client.append(pcm[at : at + step])
        next_at += chunk_ms / 1000
        await asyncio.sleep(max(0.0, next_at - loop.time()))


def first(events: list[dict], event_type: str) -> dict:
    return next(e for e in events if e["type"] == event_type)


def answer_pcm(events: list[dict]) -> bytes:
    return b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )


async def client_commit_session(server) -> WsClient:
    """A session without turn detection (``turn_detection: null``): the client
    commits. Absent, the cascade would use server VAD, OpenAI's default."""
    client, _ = await server.open()
    await client.send({"type": "session.update", "session": {"turn_detection": None}})
    assert (await client.expect("session.updated"))["session"]["turn_detection"] is None
    return client


async def vad_session(server) -> WsClient:
    client, _ = await server.open()
    await client.send(
        {
            "type": "session.update",
            "session": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}},
        }
    )
    await client.expect("session.updated")
    return client


async def spoken_turn(server, phrase: str, chunk_ms: int = 100) -> list[dict]:
    client = await vad_session(server)
    speech = speak(phrase, RATE)
    start, end = speech_bounds_ms(speech)
    await stream_paced(client, silence(LEAD_MS) + speech + silence(1200), chunk_ms)
    events = await client.recv_until("response.done", timeout=20)
    started = first(events, "input_audio_buffer.speech_started")
    stopped = first(events, "input_audio_buffer.speech_stopped")
    assert abs(started["audio_start_ms"] - (LEAD_MS + start)) <= 100
    assert abs(stopped["audio_end_ms"] - (LEAD_MS + end)) <= 100
    assert started["item_id"] == stopped["item_id"]
    heard = first(events, "conversation.item.input_audio_transcription.completed")
    assert heard["transcript"] == phrase and heard["item_id"] == started["item_id"]
    done = events[-1]
    assert done["response"]["status"] == "completed"
    answer = resample_pcm16(answer_pcm(events), RATE, 16_000)
    said = Sphinx(ANSWERS).transcribe(answer)
    # the answer's length tells a short answer (audio lost) from a mishearing
    # (eSpeak's pitch flutter carries across the process's synthesis calls)
    assert said == f"you said {phrase}", (said, f"{len(answer) / 32:.0f} ms of answer audio")
    transcript = first(events, "response.output_audio_transcript.done")["transcript"]
    assert transcript == f"You said: {phrase}."
    partials = [e for e in events if e["type"].endswith("input_audio_transcription.delta")]
    assert all(p["item_id"] == started["item_id"] for p in partials)
    await client.close()
    return events


@pytest.mark.parametrize("chunk_ms", [20, 100])
async def test_spoken_turn_with_server_vad(voice_server, chunk_ms):
    events = await spoken_turn(voice_server, PHRASES[0], chunk_ms)
    types = [e["type"] for e in events]
    # What was heard so far is told while the user still speaks.
    partial = types.index("conversation.item.input_audio_transcription.delta")
    assert partial < types.index("input_audio_buffer.speech_stopped")


async def test_the_voice_path_is_measured(voice_server):
    before = await scrape(voice_server.http_url)
    await spoken_turn(voice_server, PHRASES[1])
    after = await scrape(voice_server.http_url)
    for stage in ("vad", "asr", "tts"):
        for family in ("duplex_stage_seconds", "duplex_stage_realtime_ratio"):
            assert grew(before, after, family, f"{family}_count", stage=stage) >= 1, (family, stage)
    stopped = "duplex_speech_stopped_to_first_audio_seconds"
    assert grew(before, after, stopped, f"{stopped}_count") == 1
    rtf = "duplex_stage_realtime_ratio"
    assert grew(before, after, rtf, f"{rtf}_sum", stage="asr") > 0


async def test_several_sessions_share_the_stages(voice_server):
    await asyncio.gather(*(spoken_turn(voice_server, phrase) for phrase in PHRASES[1:4]))


async def test_without_turn_detection_the_client_commits(voice_server):
    client = await client_commit_session(voice_server)
    await stream_paced(client, silence(300) + speak(PHRASES[3]) + silence(300))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("response.done", timeout=20)
    assert not [e for e in events if e["type"].startswith("input_audio_buffer.speech_")]
    assert (
        first(events, "conversation.item.input_audio_transcription.completed")["transcript"]
        == PHRASES[3]
    )


async def test_silence_only_gets_no_turn(voice_server):
    client = await vad_session(voice_server)
    await stream_paced(client, silence(2000), chunk_ms=100)
    await client.send({"type": "session.heartbeat"})
    events = await client.recv_until("session.heartbeat_ack")
    assert [e["type"] for e in events] == ["session.heartbeat_ack"]


async def answer_started(client: WsClient) -> tuple[str, str]:
    """Ask the first question; return (response id, assistant item id) at its first audio."""
    await stream_paced(client, silence(300) + speak(PHRASES[0]) + silence(800))
    events = await client.recv_until("response.output_audio.delta", timeout=20)
    delta = events[-1]
    return delta["response_id"], delta["item_id"]


def assistant_item(server, item_id: str):
    (actor,) = server.manager.actors.values()
    return actor.state.find_item(item_id)


async def test_speech_over_the_answer_barges_in(voice_server):
    before = await scrape(voice_server.http_url)
    client = await vad_session(voice_server)
    response_id, item_id = await answer_started(client)
    await asyncio.sleep(0.4)
    await client.send({"type": "playback.ack", "played_ms": 400, "response_id": response_id})
    await stream_paced(client, speak(PHRASES[2]) + silence(800))
    events = await client.recv_until("response.done", timeout=20)  # the interrupted one
    events += await client.recv_until("response.done", timeout=20)  # the answer to the new turn
    decision = first(events, "overlap.decision")
    assert decision["action"] == "barge_in" and decision["response_id"] == response_id
    assert decision["metadata"]["overlap_ms"] >= 400
    silenced = "duplex_barge_in_to_silence_seconds"
    after = await scrape(voice_server.http_url)
    assert grew(before, after, silenced, f"{silenced}_count") == 1
    done = [e for e in events if e["type"] == "response.done"]
    assert done[0]["response"]["id"] == response_id
    assert (done[0]["response"]["status"], done[0]["response"]["duplex"]["reason"]) == (
        "cancelled",
        "barge_in",
    )
    cleared = events.index(first(events, "output_audio_buffer.cleared"))
    late = [
        e
        for e in events[cleared:]
        if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id
    ]
    assert late == []  # nothing of the old epoch after the clear
    assert assistant_item(voice_server, item_id).history_ms == 400.0  # only what was played
    heard = [e for e in events if e["type"].endswith("input_audio_transcription.completed")]
    assert heard[-1]["transcript"] == PHRASES[2]
    assert done[1]["response"]["status"] == "completed"


async def test_a_short_remark_over_the_answer_is_dropped(voice_server):
    client = await vad_session(voice_server)
    response_id, _ = await answer_started(client)
    remark = speak("yes", speed=1.6)
    assert len(remark) / 48 < 400  # shorter than the barge-in threshold
    await stream_paced(client, remark + silence(700))
    events = await client.recv_until("response.done", timeout=20)
    decision = first(events, "overlap.decision")
    assert decision["action"] == "drop" and decision["response_id"] == response_id
    assert first(events, "input_audio_buffer.cleared")
    assert events[-1]["response"]["status"] == "completed"
    assert not [e for e in events if e["type"] == "input_audio_buffer.committed"]


async def test_listen_only_defers_the_turn_to_the_end_of_the_answer(voice_server):
    client = await vad_session(voice_server)
    # A slow answer (speed 0.6: about 3 s), so the remark surely ends before it.
    update = {"overlap_policy": "listen_only", "speed": 0.6}
    await client.send({"type": "session.update", "session": update})
    await client.expect("session.updated")
    response_id, _ = await answer_started(client)
    await stream_paced(client, speak(PHRASES[2]) + silence(800))  # ends before the answer
    events = await client.recv_until("response.done", timeout=20)
    events += await client.recv_until("response.done", timeout=20)
    types = [e["type"] for e in events]
    assert first(events, "overlap.decision")["action"] == "listen"
    done = [e for e in events if e["type"] == "response.done"]
    assert done[0]["response"]["id"] == response_id
    assert done[0]["response"]["status"] == "completed"  # the answer was not cut
    committed = first(events, "input_audio_buffer.committed")
    assert committed["event"]["response_create_deferred"] is True
    assert types.index("input_audio_buffer.committed") < types.index("response.done")
    # ... and answered once the first answer ended
    assert types.index("response.created") > types.index("response.done")
    assert done[1]["response"]["status"] == "completed"
    transcript = [e for e in events if e["type"] == "response.output_audio_transcript.done"]
    assert transcript[-1]["transcript"] == f"You said: {PHRASES[2]}."


async def test_silence_only_keeps_a_bounded_buffer(voice_server):
    client = await vad_session(voice_server)
    for _ in range(3):  # 6 s of silence, sent at 4x real time
        await client.append(silence(2000))
        await client.send({"type": "session.heartbeat"})
        await client.expect("session.heartbeat_ack")
    (actor,) = voice_server.manager.actors.values()
    assert actor.state.input.audio_ms <= 300 + 1000 + 2000  # padding + slack + one chunk
    assert actor.state.input.end_ms == 6000.0  # the timeline still counts all of it


# Ten minutes sent at once: the input budget (a separate bound, tested in
# test_bad_input) is lifted so the buffer's own bound is what refuses.
@pytest.mark.server_config(max_input_realtime_factor=0)
async def test_a_monologue_is_bounded_with_a_clear_error(voice_server):
    from duplex_server.sessions.core.commands import MAX_INPUT_MS

    client = await client_commit_session(voice_server)
    chunk = silence(60_000)  # a minute a frame
    for index in range(int(MAX_INPUT_MS // 60_000)):
        await client.append(chunk, event_id=f"m{index}")
    await client.append(chunk, event_id="one-too-many")
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["event_id"]) == (
        "input_audio_buffer_full",
        "one-too-many",
    )
    await client.send({"type": "input_audio_buffer.commit", "response_create": False})
    events = await client.recv_until("input_audio_buffer.committed")
    assert events[-1]["event"]["audio_ms"] == MAX_INPUT_MS  # the refused minute is not in it


@pytest.mark.parametrize("threshold", [1.5, -0.1])
async def test_vad_threshold_outside_unit_range_is_refused(voice_server, threshold):
    client = await vad_session(voice_server)
    await client.send(
        {
            "type": "session.update",
            "session": {"turn_detection": {"type": "server_vad", "threshold": threshold}},
        }
    )
    error = await client.expect("error")
    assert error["error"]["code"] == "invalid_event"
    assert "threshold" in error["error"]["param"]
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")  # the session keeps serving


async def test_opus_in_and_out(voice_server):
    from duplex_server.audio.opus import OpusDecoder, OpusStream, split_packets

    client, _ = await voice_server.open()
    await client.send(
        {
            "type": "session.update",
            "session": {
                "input_audio_format": "opus",
                "output_audio_format": "opus",
                "turn_detection": {"type": "server_vad"},
            },
        }
    )
    await client.expect("session.updated")
    packets = split_packets(
        OpusStream().encode(
            resample_pcm16(silence(500) + speak(PHRASES[1]) + silence(1200), RATE, 48_000)
        )
    )
    for index, packet in enumerate(packets):
        await client.send(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(packet).decode()}
        )
        if index % 5 == 4:
            await asyncio.sleep(0.1)  # 100 ms of packets at a time, at real time
    events = await client.recv_until("response.done", timeout=20)
    heard = first(events, "conversation.item.input_audio_transcription.completed")
    assert heard["transcript"] == PHRASES[1]
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert {d["format"] for d in deltas} == {"opus"} and deltas[0]["sample_rate_hz"] == 48_000
    decoder = OpusDecoder()
    answer = b"".join(
        decoder.decode(packet)
        for d in deltas
        for packet in split_packets(base64.b64decode(d["delta"]))
    )
    assert Sphinx(ANSWERS).transcribe(resample_pcm16(answer, 48_000, 16_000)) == (
        f"you said {PHRASES[1]}"
    )


async def test_an_undecodable_opus_packet_is_refused(voice_server):
    client, _ = await voice_server.open()
    await client.send({"type": "session.update", "session": {"input_audio_format": "opus"}})
    await client.expect("session.updated")
    await client.send(
        {
            "type": "input_audio_buffer.append",
            "audio": base64.b64encode(b"\xff\xfe not opus").decode(),
            "event_id": "bad-packet",
        }
    )
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["event_id"]) == ("invalid_audio", "bad-packet")
    assert "Opus" in error["error"]["message"]
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")


async def test_cascade_on_local_whisper_and_vits_checkpoints(tmp_path):
    from duplex_server.engine.audio.transformers_models import WhisperAsr
    from tests.tiny_models import tiny_vits, tiny_whisper

    whisper = tiny_whisper(tmp_path / "whisper")
    vits = tiny_vits(tmp_path / "vits")
    config = ServerConfig(
        port=free_port(),
        store="memory",
        model="cascade",
        asr=f"whisper:{whisper}",
        tts=f"vits:{vits}",
    )
    speech = silence(300) + speak(PHRASES[3]) + silence(300)
    async with running_server(config) as server:
        client = await client_commit_session(server)
        await stream_paced(client, speech)
        await client.send({"type": "input_audio_buffer.commit"})
        events = await client.recv_until("response.done", timeout=30)
        await server.assert_replay_determinism()
    expected = WhisperAsr(str(whisper)).transcribe(resample_pcm16(speech, RATE, 16_000))
    completed = [e for e in events if e["type"].endswith("input_audio_transcription.completed")]
    assert [e["transcript"] for e in completed] == ([expected] if expected else [])
    assert events[-1]["response"]["status"] == "completed"
    audio = answer_pcm(events)
    assert len(audio) > RATE // 10  # VITS spoke the answer, resampled to 24 kHz


async def test_an_unknown_voice_is_refused_when_named(voice_server):
    client = await client_commit_session(voice_server)
    for session in ({"voice": "no-such-voice"}, {"audio": {"output": {"voice": "en-us+zz9"}}}):
        await client.send({"type": "session.update", "event_id": "v", "session": session})
        error = (await client.expect("error"))["error"]
        assert (error["code"], error["event_id"]) == ("invalid_value", "v")
        assert error["param"] in ("session.voice", "session.audio.output.voice")
    await client.send({"type": "response.create", "response": {"voice": "nope"}})
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "response.voice")
    for voice in ("marin", "cedar", "en-gb-x-rp+m3"):  # OpenAI's names and eSpeak's own
        await client.send({"type": "session.update", "session": {"voice": voice}})
        assert (await client.expect("session.updated"))["session"]["voice"] == voice
    await client.append(speak(PHRASES[2]))
    await client.send({"type": "input_audio_buffer.commit"})
    assert (await client.recv_until("response.done", timeout=20))[-1]["response"][
        "status"
    ] == "completed"


async def test_a_failing_recogniser_costs_the_transcript_not_the_session(voice_server):
    stages = voice_server.app.state.model.listening

    def broken(pcm16: bytes, language: str | None, prompt: str | None) -> str:
        raise RuntimeError("decoder exploded")

    stages.asr.transcribe = broken
    client = await client_commit_session(voice_server)
    await client.append(speak(PHRASES[1]))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("response.done", timeout=20)
    error = first(events, "error")
    assert (
        error["error"]["code"] == "engine_error" and "decoder exploded" in error["error"]["message"]
    )
    assert first(events, "input_audio_buffer.committed")
    assert not [e for e in events if e["type"].endswith("transcription.completed")]
    assert events[-1]["response"]["status"] == "completed"  # "please say it again"
    await client.send({"type": "session.heartbeat"})
    await client.recv_until("session.heartbeat_ack")


async def test_server_vad_by_default_and_semantic_vad_served_by_it(voice_server):
    """OpenAI's defaults: a session that names no turn detection gets server
    VAD; ``semantic_vad`` is served by the same VAD and the end-of-turn
    model, eagerness setting the pause that asks it."""
    client, created = await voice_server.open()
    assert created["session"]["turn_detection"]["type"] == "server_vad"
    await client.send(
        {
            "type": "session.update",
            "session": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}},
        }
    )
    detection = (await client.expect("session.updated"))["session"]["turn_detection"]
    assert (detection["type"], detection["eagerness"], detection["silence_duration_ms"]) == (
        "semantic_vad",
        "high",
        200,
    )
    await stream_paced(client, silence(LEAD_MS) + speak(PHRASES[0], RATE) + silence(1200))
    events = await client.recv_until("response.done", timeout=20)
    assert first(events, "input_audio_buffer.speech_stopped")
    heard = first(events, "conversation.item.input_audio_transcription.completed")
    assert heard["transcript"] == PHRASES[0] and heard["usage"]["type"] == "duration"
    assert events[-1]["response"]["status"] == "completed"


async def test_a_greeting_asked_before_any_input_is_an_empty_answer(voice_server):
    """OpenAI answers response.create on a new session (agents greet that way);
    the parrot has nothing to repeat yet, so its answer is empty and completed."""
    client = await WsClient.connect(f"ws://{voice_server.base}/v1/realtime")
    await client.expect("session.created")
    await client.send({"type": "response.create"})
    events = await client.recv_until("response.done", timeout=20)
    assert events[-1]["response"]["status"] == "completed"
    assert not [e for e in events if e["type"] in ("error", "response.output_audio.delta")]
    assert first(events, "response.output_audio_transcript.done")["transcript"] == ""
