"""Every rejected input gets its documented error; the session keeps serving
and its log gains exactly one record: the journaled error event."""

from __future__ import annotations

import json

import pytest

from tests.wsclient import b64, tone_pcm16

BIG = 64 * 1024

CASES = [
    # (name, frame, code, param)
    ("not json", "{nope", "invalid_json", None),
    ("not an object", "[1, 2]", "invalid_event", "type"),
    ("no type", json.dumps({"event_id": "e"}), "invalid_event", "type"),
    ("type not a string", json.dumps({"type": 7}), "invalid_event", "type"),
    ("unknown type", json.dumps({"type": "response.explode"}), "unknown_event_type", "type"),
    (
        "wrong field type",
        json.dumps({"type": "session.event_ack", "server_event_seq": "x"}),
        "invalid_event",
        "server_event_seq",
    ),
    (
        "negative",
        json.dumps({"type": "playback.ack", "played_ms": -1}),
        "invalid_event",
        "played_ms",
    ),
    (
        "bad enum",
        json.dumps({"type": "session.update", "session": {"overlap_policy": "shout"}}),
        "invalid_event",
        "session.overlap_policy",
    ),
    (
        "vad threshold",
        json.dumps({"type": "session.update", "session": {"turn_detection": {"threshold": 1.5}}}),
        "invalid_event",
        "session.turn_detection.threshold",
    ),
    (
        "bad base64",
        json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}),
        "invalid_audio",
        "audio",
    ),
    (
        "odd pcm16",
        json.dumps({"type": "input_audio_buffer.append", "audio": b64(b"\x01\x02\x03")}),
        "invalid_audio",
        "audio",
    ),
    (
        "f32 not multiple of 4",
        json.dumps(
            {"type": "input_audio_buffer.append", "audio": b64(b"\x00" * 6), "format": "pcm_f32le"}
        ),
        "invalid_audio",
        "audio",
    ),
    (
        "unknown format",
        json.dumps(
            {"type": "input_audio_buffer.append", "audio": b64(b"\x00\x00"), "format": "mp3"}
        ),
        "invalid_audio",
        "format",
    ),
    (
        "g711 at wrong rate",
        json.dumps(
            {
                "type": "input_audio_buffer.append",
                "audio": b64(b"\x00\x00"),
                "format": "g711_ulaw",
                "sample_rate_hz": 16000,
            }
        ),
        "invalid_audio",
        "format",
    ),
    (
        "unknown session format",
        json.dumps({"type": "session.update", "session": {"output_audio_format": "flac"}}),
        "invalid_audio",
        "session.output_audio_format",
    ),
    (
        "bad video frame",
        json.dumps(
            {
                "type": "input_audio_buffer.append",
                "audio": b64(b"\x00\x00"),
                "video_frames": ["data:,@@"],
            }
        ),
        "invalid_audio",
        "video_frames.0",
    ),
    (
        "empty commit",
        json.dumps({"type": "input_audio_buffer.commit"}),
        "input_audio_buffer_empty",
        "type",  # the event as a whole is refused
    ),
    (
        "cancel nothing",
        json.dumps({"type": "response.cancel"}),
        "response_cancel_not_active",  # OpenAI's code
        "type",
    ),
    (
        "unknown item",
        json.dumps({"type": "conversation.item.delete", "item_id": "i"}),
        "item_not_found",
        "item_id",
    ),
    (
        "oversized",
        json.dumps({"type": "input_audio_buffer.append", "audio": "A" * BIG}),
        "payload_too_large",
        None,
    ),
    ("binary garbage", b"\xff\xfe", "invalid_json", None),
    (
        "too many video frames",
        json.dumps(
            {
                "type": "input_audio_buffer.append",
                "audio": b64(b"\x00\x00"),
                "video_frames": [b64(b"\xff\xd8")] * 9,
            }
        ),
        "invalid_event",
        "video_frames",
    ),
    (
        "idle timeout beyond the server's cap",
        json.dumps({"type": "session.update", "session": {"idle_timeout_s": 1e300}}),
        "invalid_event",
        "session.idle_timeout_s",
    ),
    (
        "assistant message with user content",
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "input_text", "text": "hi"}],
                },
            }
        ),
        "invalid_event",
        "item.content.0.type",
    ),
    (
        "unknown content type",
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "video"}]},
            }
        ),
        "invalid_event",
        "item.content.0.type",
    ),
    (
        "nested too deep",
        '{"type":"session.update","session":{"metadata":{"k":' + "[" * 975 + "]" * 975 + "}}}",
        "invalid_json",
        None,
    ),
    (
        "absurd output rate",
        json.dumps({"type": "session.update", "session": {"output_sample_rate_hz": 2_400_000_000}}),
        "invalid_audio",
        "session.output_sample_rate_hz",
    ),
    (
        "input rate below the served",
        json.dumps({"type": "session.update", "session": {"input_sample_rate_hz": 4000}}),
        "invalid_audio",
        "session.input_sample_rate_hz",
    ),
    (
        "GA format rate above the served",
        json.dumps(
            {
                "type": "session.update",
                "session": {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 96000}}}},
            }
        ),
        "invalid_audio",
        "session.audio.output.format",
    ),
    (
        "append rate above the served",
        json.dumps(
            {
                "type": "input_audio_buffer.append",
                "audio": b64(b"\x00\x00"),
                "sample_rate_hz": 96000,
            }
        ),
        "invalid_audio",
        "format",
    ),
    (
        "response rate above the served",
        json.dumps(
            {
                "type": "response.create",
                "response": {
                    "audio": {"output": {"format": {"type": "audio/pcm", "rate": 192000}}}
                },
            }
        ),
        "invalid_audio",
        "response.audio.output.format",
    ),
]


@pytest.mark.server_config(max_frame_bytes=BIG)
@pytest.mark.parametrize(("name", "frame", "code", "param"), CASES, ids=[c[0] for c in CASES])
async def test_rejected_input(server, name, frame, code, param):
    client, created = await server.open()
    session_id = created["session"]["id"]
    await client.append(tone_pcm16(100) if code != "input_audio_buffer_empty" else b"")
    if code == "input_audio_buffer_empty":
        await client.send({"type": "input_audio_buffer.clear"})
        await client.expect("input_audio_buffer.cleared")
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")  # everything above is in the log now
    log = server.app.state.log
    before = await log.read(session_id)
    await client.send_raw(frame)
    error = await client.expect("error")
    assert error["error"]["code"] == code, error
    assert error["error"]["param"] == param, error
    assert error["error"]["type"] in ("invalid_request_error", "rate_limit_error")
    after = await log.read(session_id)
    assert after[: len(before)] == before  # nothing lost or rewritten
    assert [r.kind for r in after[len(before) :]] == ["out"]  # only the journaled error
    # The session keeps serving: a normal turn still works.
    await client.append(tone_pcm16(100))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("response.done")
    assert events[-1]["response"]["status"] == "completed"


async def test_error_echoes_event_id(server):
    client, _ = await server.open()
    await client.send({"type": "input_audio_buffer.append", "audio": "%%", "event_id": "ev-9"})
    error = await client.expect("error")
    assert error["error"]["event_id"] == "ev-9"
    await client.send({"type": "nope", "event_id": "ev-10"})
    assert (await client.expect("error"))["error"]["event_id"] == "ev-10"


@pytest.mark.server_config(mailbox_size=4)
async def test_flood_is_rate_limited_without_losing_accepted_events(server):
    client, created = await server.open()
    chunk = tone_pcm16(20)
    for index in range(200):
        await client.append(chunk, event_id=f"f{index}")
    errors = []
    acked = False
    for attempt in range(50):  # the heartbeat itself may be refused while flooded
        await client.send({"type": "session.heartbeat", "event_id": f"hb{attempt}"})
        while True:
            event = await client.recv()
            if event["type"] == "session.heartbeat_ack":
                acked = True
                break
            assert event["type"] == "error"
            if event["error"]["event_id"] == f"hb{attempt}":
                break
            errors.append(event)
        if acked:
            break
    assert acked
    assert errors and {e["error"]["code"] for e in errors} == {"rate_limited"}
    assert {e["error"]["type"] for e in errors} == {"rate_limit_error"}
    records = await server.app.state.log.read(created["session"]["id"])
    accepted = [r for r in records if r.kind == "audio"]
    rejected = {e["error"]["event_id"] for e in errors}
    assert len(accepted) + len(rejected) == 200
    assert not rejected & {r.event_id for r in accepted}


@pytest.mark.server_config(max_frame_bytes=BIG)
async def test_a_frame_past_the_envelope_is_refused_before_it_is_buffered(server):
    """Up to the limit plus the envelope a frame gets a coded error (above);
    past that the WebSocket layer closes the socket (1009) without reading it
    whole, and other sessions carry on."""
    import websockets

    from duplex_server.transport import FRAME_ENVELOPE_BYTES

    bystander, _ = await server.open()
    client, _ = await server.open()
    frame = json.dumps(
        {"type": "input_audio_buffer.append", "audio": "A" * (BIG + FRAME_ENVELOPE_BYTES)}
    )
    await client.send_raw(frame)
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await client.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    await bystander.send({"type": "session.heartbeat"})
    await bystander.expect("session.heartbeat_ack")


@pytest.mark.server_config(max_input_realtime_factor=2.0, input_burst_ms=1000.0)
async def test_input_faster_than_the_budget_is_rate_limited(server):
    """Far more audio than real time allows: what is past the burst is refused
    (rate_limited, naming each event), what was admitted is in the log in
    order, and another session's heartbeat is answered meanwhile."""
    bystander, _ = await server.open()
    client, created = await server.open()
    for index in range(40):  # 4 s of audio, sent at once
        await client.append(tone_pcm16(100), event_id=f"a{index}")
    await client.send({"type": "session.heartbeat"})
    events = await client.recv_until("session.heartbeat_ack")
    refused = [e["error"]["event_id"] for e in events if e["type"] == "error"]
    assert refused and all(
        e["error"]["code"] == "rate_limited" for e in events if e["type"] == "error"
    )
    admitted = 40 - len(refused)
    assert 10 <= admitted < 40  # the 1 s burst, and a little earned meanwhile
    assert refused == [f"a{i}" for i in range(40) if f"a{i}" in refused]
    await bystander.send({"type": "session.heartbeat"})
    await bystander.recv_until("session.heartbeat_ack")
    records = await server.app.state.log.read(created["session"]["id"])
    audio = [r for r in records if r.body.__class__.__name__ == "AudioBody"]
    assert len(audio) == admitted


@pytest.mark.server_config(max_session_media_bytes=20_000, max_input_realtime_factor=0)
async def test_a_sessions_media_is_bounded_over_its_life(server):
    client, created = await server.open()
    for index in range(5):  # 4,800 bytes each: 24,000 in all, past the 20,000 cap
        await client.append(tone_pcm16(100), event_id=f"a{index}")
    await client.append(tone_pcm16(100), event_id="past")
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["event_id"]) == ("resource_exhausted", "past")
    await client.send({"type": "input_audio_buffer.commit"})  # the rest of the session works
    await client.recv_until("response.done")


async def test_a_large_append_is_decoded_off_the_event_loop(server, monkeypatch):
    """Big appends are decoded on a worker thread (the loop keeps serving);
    what they say, and what is wrong with them, is unchanged."""
    import asyncio

    from duplex_server.sessions.runtime import actor as actor_module

    offloaded = []
    real = asyncio.to_thread

    async def counting(function, *args):
        offloaded.append(function.__name__)
        return await real(function, *args)

    monkeypatch.setattr(actor_module.asyncio, "to_thread", counting)
    client, created = await server.open()
    await client.append(tone_pcm16(6000), event_id="big")  # 288 KB: past the offload size
    await client.append(tone_pcm16(100), event_id="small")
    await client.send_raw(
        json.dumps({"type": "input_audio_buffer.append", "audio": b64(b"\x01" * 300_001)})
    )
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_audio", "audio")
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("input_audio_buffer.committed")
    assert events[-1]["event"]["audio_ms"] == 6100.0
    assert offloaded == ["decode_append", "decode_append"]  # the big one and the bad one
