"""conversation.item.* and playback truth (acks, truncation, commit policies)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.e2e.sequences import RESPONSE_CLOSE
from tests.wsclient import b64, tone_pcm16, types_of


async def answered_turn(client, text: str = "alpha beta gamma", ms: float = 300) -> dict:
    await client.send({"type": "input.text.append", "text": text})
    await client.append(tone_pcm16(ms))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    return events[-2]["response"]


async def truncate(client, item_id: str, end_ms: float, content_index: int = 0) -> None:
    await client.send(
        {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": content_index,
            "audio_end_ms": end_ms,
        }
    )


def assistant_item(server, item_id: str):
    (actor,) = server.manager.actors.values()
    return actor.state.find_item(item_id)


async def test_item_create_retrieve_delete(server):
    client, _ = await server.open()
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "typed words"}],
    }
    await client.send({"type": "conversation.item.create", "item": item})
    events = await client.recv_until("conversation.item.done")
    assert types_of(events) == [
        "conversation.item.added",
        "conversation.item.created",
        "conversation.item.done",
    ]
    item_id = events[0]["item"]["id"]
    assert events[0]["item"]["content"] == [{"type": "input_text", "text": "typed words"}]
    await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
    retrieved = await client.expect("conversation.item.retrieved")
    assert retrieved["item"]["id"] == item_id
    await client.send({"type": "conversation.item.delete", "item_id": item_id})
    assert (await client.expect("conversation.item.deleted"))["item_id"] == item_id
    await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
    assert (await client.expect("error"))["error"]["code"] == "item_not_found"


async def test_created_user_item_can_be_answered(server):
    client, _ = await server.open()
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": b64(tone_pcm16(200))}],
    }
    await client.send({"type": "conversation.item.create", "item": item})
    await client.recv_until("conversation.item.done")
    await client.send({"type": "response.create"})
    events = await client.recv_until("rate_limits.updated")
    assert events[-2]["response"]["duplex"]["playback"]["generated_ms"] == 200.0


async def test_function_call_output_item(server):
    client, _ = await server.open()
    await client.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "output": "{}"},
        }
    )
    error = await client.expect("error")
    assert error["error"]["code"] == "invalid_event"
    assert error["error"]["param"] == "item.call_id"
    output = {"type": "function_call_output", "call_id": "c1", "output": '{"ok": true}'}
    await client.send({"type": "conversation.item.create", "event_id": "o1", "item": output})
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"], error["event_id"]) == (
        "unknown_function_call",
        "item.call_id",
        "o1",
    )
    # A call the client restores into the conversation may be answered, once.
    call = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"}
    await client.send({"type": "conversation.item.create", "item": call})
    await client.recv_until("conversation.item.done")
    await client.send({"type": "conversation.item.create", "item": output})
    added = (await client.recv_until("conversation.item.done"))[0]
    assert added["item"]["call_id"] == "c1" and added["item"]["output"] == '{"ok": true}'
    await client.send({"type": "conversation.item.create", "event_id": "o2", "item": output})
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["event_id"]) == ("duplicate_function_call_output", "o2")


async def test_previous_item_id_must_exist(server):
    client, _ = await server.open()
    await client.send(
        {
            "type": "conversation.item.create",
            "previous_item_id": "item_x",
            "item": {"role": "user", "content": []},
        }
    )
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["param"]) == (
        "item_not_found",
        "previous_item_id",
    )


async def test_truncate_cuts_audio_and_transcript(server):
    client, _ = await server.open()
    response = await answered_turn(client)
    item_id = response["output"][0]["id"]
    await truncate(client, item_id, 150)
    truncated = await client.expect("conversation.item.truncated")
    assert truncated["audio_end_ms"] == 150
    item = assistant_item(server, item_id)
    # Chunks of 100 ms carry one word each: by 150 ms only "alpha" was spoken.
    assert item.parts[0].transcript == "alpha"
    assert item.parts[0].audio_ms == 150 and item.history_ms == 150
    await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
    retrieved = await client.expect("conversation.item.retrieved")
    assert retrieved["item"]["content"][0]["transcript"] == "alpha"


async def test_truncate_rejects_bad_targets(server):
    client, _ = await server.open()
    response = await answered_turn(client)
    item_id = response["output"][0]["id"]
    await truncate(client, item_id, 5000)
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_event", "audio_end_ms")
    user_item = next(e for e in client.received if e["type"] == "conversation.item.added")
    await truncate(client, user_item["item"]["id"], 10)
    assert (await client.expect("error"))["error"]["param"] == "content_index"


async def test_ack_only_history_follows_acks(server):
    client, _ = await server.open()
    response = await answered_turn(client)
    item_id = response["output"][0]["id"]
    assert assistant_item(server, item_id).history_ms == 0.0
    await client.send({"type": "playback.ack", "played_ms": 150, "response_id": response["id"]})
    ack = (await client.recv_until("playback.acknowledged"))[-1]
    assert ack["playback"] == {
        "generated_ms": 300.0,
        "sent_ms": 300.0,
        "played_ms": 150.0,
        "committed_ms": 150.0,
    }
    assert ack["history_committed"] is False
    assert assistant_item(server, item_id).history_ms == 150.0
    await client.send({"type": "playback.ack", "played_ms": 300, "item_id": item_id})
    ack = (await client.recv_until("playback.acknowledged"))[-1]
    assert ack["history_committed"] is True
    assert assistant_item(server, item_id).history_ms == 300.0


async def test_ack_cannot_claim_more_than_generated(server):
    client, _ = await server.open()
    response = await answered_turn(client)
    await client.send({"type": "playback.ack", "played_ms": 99999})
    ack = (await client.recv_until("playback.acknowledged"))[-1]
    assert ack["playback"]["played_ms"] == 300.0 and ack["response_id"] == response["id"]


async def test_commit_all_on_done(server):
    client, _ = await server.open()
    await client.send(
        {"type": "session.update", "session": {"playback_commit_policy": "commit_all_on_done"}}
    )
    await client.expect("session.updated")
    response = await answered_turn(client)
    # All of it counts as played at response.done: the floor is free.
    assert (await client.expect("turn.event"))["event"] == "idle"
    item = assistant_item(server, response["output"][0]["id"])
    assert item.history_ms == 300.0
    await client.send({"type": "playback.ack", "played_ms": 100})
    ack = (await client.recv_until("playback.acknowledged"))[-1]
    assert ack["history_committed"] is True and ack["playback"]["played_ms"] == 100.0


async def test_truncating_ack_mid_response(server):
    client, _ = await server.open()
    await client.send({"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 40}}})
    await client.expect("session.updated")
    await client.send({"type": "input.text.append", "text": "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10"})
    await client.append(tone_pcm16(1000))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("response.output_audio_transcript.delta")
    response_id = next(e for e in events if e["type"] == "response.created")["response"]["id"]
    await client.send({"type": "playback.ack", "played_ms": 100, "truncate": True})
    events = await client.recv_until("playback.acknowledged")
    ack = events[-1]
    assert ack["truncated"] is True and ack["response_id"] == response_id
    await client.send({"type": "response.cancel"})
    events = await client.recv_until("rate_limits.updated")
    item = assistant_item(server, f"item_{response_id}")
    assert item.truncated and item.history_ms == 100.0
    assert item.parts[0].transcript == "w1"


async def test_playback_ack_without_response(server):
    client, _ = await server.open()
    await client.send({"type": "playback.ack", "played_ms": 10, "event_id": "a1"})
    error = await client.expect("error")
    assert error["error"]["code"] == "response_not_found" and error["error"]["event_id"] == "a1"


def dominant_hz(pcm: bytes, rate: int) -> float:
    samples = np.frombuffer(pcm, "<i2").astype(float)
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.argmax(spectrum) * rate / len(samples))


@pytest.mark.parametrize(
    ("in_fmt", "in_rate", "encode", "out_fmt", "out_rate"),
    [
        ("g711_ulaw", 8000, "ulaw", "g711_alaw", 8000),
        ("pcm_f32le", 16000, "f32", "pcm16", 24000),
        ("pcm16", 48000, "pcm16", "g711_ulaw", 8000),
    ],
)
async def test_formats_in_and_out_keep_the_tone(server, in_fmt, in_rate, encode, out_fmt, out_rate):
    from duplex_server.audio import encode_from_pcm16
    from duplex_server.audio.g711 import ALAW_TO_PCM16, ULAW_TO_PCM16
    from protocol.audio_formats import AudioFormat

    client, _ = await server.open()
    await client.send(
        {
            "type": "session.update",
            "session": {
                "input_audio_format": in_fmt,
                "input_sample_rate_hz": in_rate,
                "output_audio_format": out_fmt,
                "output_sample_rate_hz": out_rate,
            },
        }
    )
    updated = await client.expect("session.updated")
    assert updated["session"]["duplex"]["input_format"] == {"type": in_fmt, "rate": in_rate}
    source = tone_pcm16(500, rate=24000, freq=600)
    wire = encode_from_pcm16(source, 24000, AudioFormat(in_fmt, in_rate))
    await client.send({"type": "input_audio_buffer.append", "audio": b64(wire)})
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert {(d["format"], d["sample_rate_hz"]) for d in deltas} == {(out_fmt, out_rate)}
    out = b"".join(base64.b64decode(d["delta"]) for d in deltas)
    if out_fmt == "g711_alaw":
        pcm = ALAW_TO_PCM16[np.frombuffer(out, np.uint8)].tobytes()
    elif out_fmt == "g711_ulaw":
        pcm = ULAW_TO_PCM16[np.frombuffer(out, np.uint8)].tobytes()
    else:
        pcm = out
    assert len(pcm) // 2 == pytest.approx(out_rate * 0.5, abs=2)
    assert dominant_hz(pcm, out_rate) == pytest.approx(600, abs=4)
    assert types_of(events)[-len(RESPONSE_CLOSE) :] == RESPONSE_CLOSE
