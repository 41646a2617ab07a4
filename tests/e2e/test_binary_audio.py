"""Binary audio on the duplex wire (``?audio=binary``, protocol/audio_frames.py):
the same session as JSON audio, binary output, acks and resume, malformed
frames refused with a code, the OpenAI endpoint refusing the option, and
DuplexClient using it."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import msgspec
import pytest
import websockets

from clients.duplex import (
    DuplexClient,
    DuplexConnectionError,
    DuplexTrace,
    ReconnectPolicy,
    presets,
)
from protocol import server_events as se
from protocol.audio_frames import (
    HEADER_BYTES,
    AudioFrame,
    FrameKind,
    pack,
    unpack,
)
from tests.wsclient import RECV_TIMEOUT_S, b64, tone_pcm16

CHUNK_BYTES = 4800  # 100 ms of pcm16 at 24 kHz
FAST = ReconnectPolicy(max_attempts=5, initial_backoff_s=0.02, max_backoff_s=0.1)


class Socket:
    """A raw client that reads text frames as dicts and binary frames as AudioFrames."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws

    @classmethod
    async def connect(cls, server, query: str = "audio=binary", path: str = "/v1/duplex") -> Socket:
        url = f"ws://{server.base}{path}" + (f"?{query}" if query else "")
        return cls(await websockets.connect(url, max_size=None))

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def send_frame(self, data: bytes) -> None:
        await self.ws.send(data)

    async def recv(self) -> dict[str, Any] | AudioFrame:
        frame = await asyncio.wait_for(self.ws.recv(), RECV_TIMEOUT_S)
        return unpack(frame, 1 << 30) if isinstance(frame, bytes) else json.loads(frame)

    async def until(self, *types: str) -> list[dict[str, Any] | AudioFrame]:
        out = []
        while True:
            message = await self.recv()
            out.append(message)
            if isinstance(message, dict) and message["type"] in types:
                return out

    async def expect(self, event_type: str) -> dict[str, Any]:
        message = await self.recv()
        assert isinstance(message, dict) and message["type"] == event_type, message
        return message

    async def close(self) -> None:
        await self.ws.close()


def input_frame(pcm: bytes, seq: int, **fields: Any) -> bytes:
    return pack(
        AudioFrame(
            kind=FrameKind.INPUT_APPEND,
            format="pcm16",
            sequence=seq,
            payload=pcm,
            sample_rate_hz=24_000,
            duration_us=round(len(pcm) * 1000 / 48),  # 48 bytes a millisecond
            **fields,
        )
    )


def chunks(ms: int) -> list[bytes]:
    pcm = tone_pcm16(ms)
    return [pcm[i : i + CHUNK_BYTES] for i in range(0, len(pcm), CHUNK_BYTES)]


def delta_pairs(messages: list) -> list[tuple[dict, AudioFrame]]:
    """Every audio delta with the frame that follows it; asserts each has one,
    at once, carrying its seq, and that no delta carries audio itself."""
    pairs = []
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message["type"] == "response.output_audio.delta":
            assert message["delta"] == ""
            frame = messages[i + 1]
            assert isinstance(frame, AudioFrame) and frame.kind is FrameKind.OUTPUT_DELTA
            assert frame.sequence == message["server_event_seq"]
            assert (frame.format, frame.sample_rate_hz) == (
                message["format"],
                message["sample_rate_hz"],
            )
            assert frame.duration_us == round(message["metadata"]["audio_duration_ms"] * 1000)
            pairs.append((message, frame))
    frames = [m for m in messages if isinstance(m, AudioFrame)]
    assert len(frames) == len(pairs)  # no frame without its event
    return pairs


def client_records(records: list, session_id: str) -> str:
    """What the client's events logged, every field but the time, with the
    session's own id (which item ids carry) named alike."""
    rows = [
        (r.kind, r.epoch, r.origin, r.event_id, r.event_digest, r.body)
        for r in records
        if r.origin == "client"
    ]
    return msgspec.json.encode(rows).decode().replace(session_id[-10:], "SESSION")


async def test_a_binary_session_logs_what_a_json_session_logs(server):
    audio = chunks(500)
    # JSON: each append is the event a binary frame stands for
    plain = await Socket.connect(server, query="")
    created = await plain.expect("session.created")
    for seq, pcm in enumerate(audio, 1):
        await plain.send(
            {
                "type": "input_audio_buffer.append",
                "event_id": f"audio_{seq}",
                "audio": b64(pcm),
                "format": "pcm16",
                "sample_rate_hz": 24_000,
                "duration_ms": 100.0,
            }
        )
    await plain.send({"type": "input_audio_buffer.commit", "event_id": "commit_1"})
    json_events = await plain.until("response.done")
    # binary
    binary = await Socket.connect(server)
    assert binary.ws.response.headers["x-duplex-audio"] == "binary"
    binary_created = await binary.expect("session.created")
    for seq, pcm in enumerate(audio, 1):
        await binary.send_frame(input_frame(pcm, seq))
    await binary.send({"type": "input_audio_buffer.commit", "event_id": "commit_1"})
    binary_messages = await binary.until("response.done")

    log = server.app.state.log
    json_id, binary_id = created["session"]["id"], binary_created["session"]["id"]
    json_records = await log.read(json_id)
    binary_records = await log.read(binary_id)
    assert client_records(binary_records, binary_id) == client_records(json_records, json_id)
    assert sum(r.kind == "audio" for r in binary_records) == len(audio)
    assert [r.kind for r in binary_records] == [r.kind for r in json_records]
    # The journal is the same events; only the socket's edge differs.
    json_types = [e["type"] for e in json_events]
    assert [m["type"] for m in binary_messages if isinstance(m, dict)] == json_types
    sent_audio = [
        base64.b64decode(e["delta"]) for e in json_events if e["type"].endswith("audio.delta")
    ]
    pairs = delta_pairs(binary_messages)
    assert [frame.payload for _, frame in pairs] == sent_audio
    assert b"".join(sent_audio) == b"".join(audio)  # echo: the answer is the question
    # The folded sessions agree (up to their ids).
    json_state = server.manager.actors[json_id].state
    binary_state = server.manager.actors[binary_id].state
    assert binary_state.input == json_state.input
    assert (binary_state.item_count, binary_state.response_count) == (
        json_state.item_count,
        json_state.response_count,
    )
    assert binary_state.recent_event_ids == json_state.recent_event_ids
    await plain.close()
    await binary.close()


async def test_binary_output_is_acked_and_resumed_after_a_drop(server):
    first = await Socket.connect(server)
    created = await first.expect("session.created")
    session_id, token = created["session"]["id"], created["resume_token"]
    await first.send({"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 20}}})
    await first.expect("session.updated")
    pcm = tone_pcm16(1000)
    for seq, offset in enumerate(range(0, len(pcm), CHUNK_BYTES), 1):
        await first.send_frame(input_frame(pcm[offset : offset + CHUNK_BYTES], seq))
    await first.send({"type": "input_audio_buffer.commit"})
    before = await first.until("response.output_audio.delta")
    before.append(await first.recv())  # its frame
    before_pairs = delta_pairs(before)
    cursor = before_pairs[-1][0]["server_event_seq"]
    await first.send({"type": "session.event_ack", "server_event_seq": cursor})
    await first.close()  # the network drops mid-answer
    await asyncio.sleep(0.3)

    second = await Socket.connect(server, query="audio=binary&autostart=0")
    await second.send(
        {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": token,
            "last_received_server_event_seq": cursor,
        }
    )
    resumed = await second.expect("session.resumed")
    assert resumed["replay_from_seq"] == cursor + 1
    after = await second.until("response.done")
    after_pairs = delta_pairs(after)
    seqs = [m["server_event_seq"] for m in after if isinstance(m, dict)]
    # Every GA event the journal holds after the cursor, once, in order.
    beta = {cls.__struct_config__.tag for cls in se.BETA_TWIN.values()}
    journal = server.manager.actors[session_id].journal.since(cursor)
    assert (
        seqs
        == [seq for seq, payload in journal if json.loads(payload)["type"] not in beta][: len(seqs)]
    )
    # Every byte of the answer, once, across the drop.
    heard = b"".join(frame.payload for _, frame in before_pairs + after_pairs)
    assert heard == pcm
    response_id = after_pairs[-1][0]["response_id"]
    await second.send({"type": "playback.ack", "response_id": response_id, "played_ms": 1000})
    acked = await second.until("playback.acknowledged")
    assert acked[-1]["playback"]["played_ms"] == 1000
    await second.close()


@pytest.mark.server_config(max_frame_bytes=64 * 1024)
async def test_malformed_frames_are_refused_and_the_session_serves_on(server):
    client = await Socket.connect(server)
    await client.expect("session.created")
    good = input_frame(tone_pcm16(100), 5)
    bad = {
        "frame.header": good[: HEADER_BYTES - 4],
        "frame.magic": b"\x00" + good[1:],
        "frame.format": good[:3] + b"\x2a" + good[4:],
        "frame.kind": good[:2] + b"\x02" + good[3:],  # an output frame
        "frame": good + b"\0" * (64 * 1024),  # over max_frame_bytes, inside the envelope
    }
    for param, data in bad.items():
        await client.send_frame(data)
        error = await client.expect("error")
        code = "payload_too_large" if param == "frame" else "invalid_audio_frame"
        assert (error["error"]["code"], error["error"]["param"]) == (code, param)
    # A well-formed frame whose audio the session refuses: the append's own
    # refusal, under the frame's event_id, as the JSON event would get it.
    lying = input_frame(tone_pcm16(100), 9)
    lying = lying[:12] + (50_000).to_bytes(4, "little") + lying[16:]  # declares 50 ms
    await client.send_frame(lying)
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["event_id"]) == ("invalid_audio", "audio_9")
    assert error["error"]["param"] == "duration_ms"
    # The session still serves.
    await client.send_frame(good)
    await client.send({"type": "input_audio_buffer.commit"})
    answer = delta_pairs(await client.until("response.done"))
    assert b"".join(frame.payload for _, frame in answer) == tone_pcm16(100)
    # A retried frame (same sequence) is a retry, never applied twice.
    await client.send_frame(good)
    error = (await client.until("error"))[-1]
    assert (error["error"]["code"], error["error"]["event_id"]) == ("duplicate_event", "audio_5")
    await client.close()


async def test_the_openai_endpoint_refuses_binary_audio(server):
    for query, code in (("audio=binary", "binary_audio_unsupported"),):
        client = await Socket.connect(server, query=query, path="/v1/realtime")
        assert "x-duplex-audio" not in client.ws.response.headers
        error = await client.expect("error")
        assert (error["error"]["code"], error["error"]["param"]) == (code, "audio")
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await client.recv()
        assert closed.value.rcvd.code == 1008
    # An audio transport nobody serves is refused, not read as JSON.
    client = await Socket.connect(server, query="audio=morse")
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "audio")
    # JSON clients are unchanged: a binary frame there is read as JSON, as before.
    plain = await Socket.connect(server, query="")
    await plain.expect("session.created")
    await plain.send_frame(input_frame(tone_pcm16(100), 1))
    assert (await plain.expect("error"))["error"]["code"] == "invalid_json"
    await plain.close()


async def test_duplex_client_uses_binary_audio(server):
    trace = DuplexTrace()
    async with DuplexClient(
        f"ws://{server.base}/v1/duplex",
        config=presets.echo(chunk_delay_ms=10),
        timeout_s=5,
        trace=trace,
        reconnect=FAST,
    ) as client:
        assert client.uses_binary_audio
        await client.stream_pcm(tone_pcm16(600), chunk_ms=100, realtime=False)
        await client.commit()
        seen = []
        async for event in client.events(timeout_s=5):
            seen.append(event)
            deltas = [e for e in seen if isinstance(e, se.OutputAudioDelta)]
            if len(deltas) == 2 and len(seen) < 60:
                client._ws.transport.abort()  # the network drops under the client
            if isinstance(event, se.ResponseDone):
                break
        response_id = next(e.response.id for e in seen if isinstance(e, se.ResponseCreated))
        view = client._demux.responses[response_id]
        assert b"".join(view.audio) == tone_pcm16(600)  # once each, across the drop
        assert client.uses_binary_audio  # the resumed socket asked again and got it
        ack = await client.ack_playback(600, response_id)
        assert ack.playback is not None and ack.playback.played_ms == 600
    out = [frame for _, direction, frame in trace.frames if direction == "out"]
    appends = [unpack(f, 1 << 20) for f in out if isinstance(f, bytes)]
    assert [a.duration_us for a in appends] == [100_000] * 6
    assert not [f for f in out if isinstance(f, str) and "input_audio_buffer.append" in f]
    inbound = [frame for _, direction, frame in trace.frames if direction == "in"]
    assert any(isinstance(f, bytes) for f in inbound)


async def test_duplex_client_binary_audio_options(server):
    # Not asked for on OpenAI's endpoint by default: JSON audio there.
    async with DuplexClient(
        f"ws://{server.base}/v1/realtime", config=presets.echo(), timeout_s=5
    ) as client:
        assert not client.uses_binary_audio
        await client.append_audio(tone_pcm16(100))
        await client.commit()
        await client.create_response()  # OpenAI's semantics: a commit answers nothing
        response = await anext(client.responses(timeout_s=5))
        await response.wait()
        assert response.audio_bytes == tone_pcm16(100)
    # Required there: refused.
    with pytest.raises(DuplexConnectionError):
        async with DuplexClient(
            f"ws://{server.base}/v1/realtime", timeout_s=5, binary_audio=True, reconnect=None
        ):
            pass
    # Off: the duplex wire in JSON, as before.
    async with DuplexClient(
        f"ws://{server.base}/v1/duplex", config=presets.echo(), binary_audio=False
    ) as client:
        assert not client.uses_binary_audio
