"""DuplexClient against the real server (echo), and against a misbehaving peer."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from clients.duplex import (
    ConnectionResumed,
    DuplexClient,
    DuplexConnectionError,
    DuplexProtocolError,
    DuplexSessionClosedError,
    DuplexTrace,
    EventCollector,
    ReconnectPolicy,
    audio_data_url,
    presets,
)
from protocol import server_events as se
from tests.conftest import free_port
from tests.wsclient import b64, tone_pcm16

FAST = ReconnectPolicy(max_attempts=5, initial_backoff_s=0.02, max_backoff_s=0.1)


def client_for(server, **kwargs) -> DuplexClient:
    kwargs.setdefault("config", presets.echo())
    return DuplexClient(f"ws://{server.base}/v1/duplex", timeout_s=5, **kwargs)


async def test_full_turn(server):
    async with client_for(server) as client:
        assert client.session_id and client.resume_token
        first = await anext(client.events(timeout_s=1))
        assert isinstance(first, se.SessionCreated) and first.session.id == client.session_id
        collector = EventCollector()
        client.add_listener(collector.add)
        await client.stream_pcm(tone_pcm16(300), chunk_ms=100, realtime=False)
        collector.mark_sent("commit")
        committed = await client.commit()
        assert committed.event.turn_id == 1
        async for response in client.responses(timeout_s=5):
            chunks = [chunk async for chunk in response.audio()]
            await response.wait()
            break
        assert response.status == "completed" and response.decision == "speak"
        assert b"".join(chunks) == tone_pcm16(300)
        summary = collector.timing_summary()
        assert summary["audio_deltas"] == 3 and summary["first_audio_ms"] is not None
    assert client.closed_reason == "client_close"


async def test_interruption(server):
    async with client_for(server, config=presets.echo(chunk_delay_ms=40)) as client:
        await client.append_audio(tone_pcm16(2000))
        await client.commit()
        response = None
        async for response in client.responses(timeout_s=5):
            async for _chunk in response.audio():
                break
            break
        cleared = await client.barge_in()
        assert isinstance(cleared, se.OutputAudioCleared) and cleared.epoch == 1
        await response.wait()
        assert (response.status, response.reason) == ("cancelled", "barge_in")


async def test_resume_after_a_dropped_transport(server):
    async with client_for(
        server, config=presets.echo(chunk_delay_ms=20), reconnect=FAST, ack_every=1_000_000
    ) as client:
        await client.append_audio(tone_pcm16(1000))
        await client.commit()
        seen: list = []
        resumed = 0
        async for event in client.events(timeout_s=5):
            seen.append(event)
            if isinstance(event, se.OutputAudioDelta) and resumed == 0 and len(seen) < 40:
                client._ws.transport.abort()  # the network drops under the client
            if isinstance(event, ConnectionResumed):
                resumed += 1
            if isinstance(event, se.ResponseDone):
                break
        assert resumed == 1
        resumes = [e for e in seen if isinstance(e, se.SessionResumed)]
        assert len(resumes) == 1 and resumes[0].attachment_generation == 2
        seqs = [e.server_event_seq for e in seen if getattr(e, "server_event_seq", None)]
        assert len(seqs) == len(set(seqs)) and seqs == sorted(seqs)
        # Compare with the server's journal: every GA event, once, none missing.
        actor = server.manager.actors[client.session_id]
        beta = {cls.__struct_config__.tag for cls in se.BETA_TWIN.values()}
        journal = [
            seq
            for seq, payload in actor.journal.since(0)
            if json.loads(payload)["type"] not in beta and seq <= seqs[-1]
        ]
        assert seqs == journal


@pytest.mark.server_config(idle_ttl_s=1.5, reap_interval_s=0.05)
async def test_heartbeat_keeps_an_idle_session_alive(server):
    async with client_for(server, heartbeat_interval_s=0.2) as kept:
        idle = client_for(server, heartbeat_interval_s=None, reconnect=None)
        async with idle:
            expiry = asyncio.create_task(idle.wait_for("session.expired", timeout_s=6))
            await asyncio.sleep(2.4)  # past the TTL; the kept client beat 12 times
            expired = await expiry
            assert expired.reason == "idle_ttl_expired"
            await kept.append_audio(tone_pcm16(100))
            assert (await kept.commit(create_response=False)).event.turn_id == 1
        assert idle.closed_reason == "idle_ttl_expired"


async def test_error_classes(server):
    async with client_for(server) as client:
        with pytest.raises(DuplexProtocolError) as err:
            await client.cancel_response()
        assert err.value.code == "response_cancel_not_active" and err.value.event_id
        with pytest.raises(DuplexProtocolError) as err:
            await client.commit()
        assert err.value.code == "input_audio_buffer_empty"
    with pytest.raises(DuplexConnectionError):
        async with DuplexClient(f"ws://127.0.0.1:{free_port()}/v1/duplex", timeout_s=2):
            pass
    async with client_for(server, reconnect=None) as fragile:
        fragile._ws.transport.abort()
        with pytest.raises(DuplexSessionClosedError):
            await fragile.wait_for("session.heartbeat_ack", timeout_s=5)


async def test_video_frames_ride_their_second_and_playback_is_acked(server):
    trace = DuplexTrace()
    frames = [audio_data_url(b"\xff\xd8 first", "image/jpeg"), b64(b"\xff\xd8 second")]
    # binary_audio=False: the JSON appends are what this test reads off the trace
    async with client_for(server, trace=trace, binary_audio=False) as client:
        await client.stream_pcm(tone_pcm16(2500), realtime=False, video_frames=frames)
        await client.commit()
        response = await anext(client.responses(timeout_s=5))
        await response.wait()
        assert client.output_format.duration_ms(len(response.audio_bytes)) == 2500
        ack = await client.ack_playback(
            1500, committed_ms=1000, item_id=f"item_{response.response_id}"
        )
        assert ack.response_id == response.response_id and ack.playback is not None
        assert (ack.playback.played_ms, ack.playback.committed_ms) == (1500, 1000)
    sent = [json.loads(frame) for _, direction, frame in trace.frames if direction == "out"]
    appends = [event for event in sent if event["type"] == "input_audio_buffer.append"]
    assert len(appends) == 25 and appends[-1]["audio_end_ms"] == 2500
    carrying = {i: e["video_frames"] for i, e in enumerate(appends) if "video_frames" in e}
    # the 10th append completes the first second, the 20th the second; bare base64
    assert carrying == {9: [b64(b"\xff\xd8 first")], 19: [b64(b"\xff\xd8 second")]}


async def test_injected_transport_and_explicit_close(server):
    opened: list[str] = []

    async def connect(url: str):
        opened.append(url)
        return await websockets.connect(url)

    async with client_for(server, connect=connect) as client:
        await client.close()
        assert client.closed_reason == "client_close"
        await client.close()  # again, and once more on leaving the block: nothing happens
    assert len(opened) == 1 and "autostart=0" in opened[0]


# --- a peer that breaks the protocol -----------------------------------------

CREATED = json.dumps(
    {
        "type": "session.created",
        "server_event_seq": None,
        "resume_token": "t",
        "attachment_generation": 1,
    }
)


async def misbehaving(script) -> int:
    port = free_port()

    async def handler(ws):
        await ws.recv()  # session.update
        await script(ws)
        await asyncio.sleep(5)

    server = await websockets.serve(handler, "127.0.0.1", port)
    return port, server


@pytest.mark.parametrize(
    ("name", "frames", "code"),
    [
        ("malformed", ["{oops"], "invalid_json"),
        (
            "unknown type",
            [json.dumps({"type": "response.teleport", "server_event_seq": 1})],
            "invalid_event",
        ),
        (
            "seq backwards",
            [
                json.dumps({"type": "session.heartbeat_ack", "server_event_seq": 5}),
                json.dumps({"type": "session.heartbeat_ack", "server_event_seq": 3}),
            ],
            "invalid_event",
        ),
    ],
)
async def test_bad_peer_is_reported_never_hangs(name, frames, code):
    async def script(ws):
        await ws.send(CREATED)
        for frame in frames:
            await ws.send(frame)

    port, server = await misbehaving(script)
    try:
        async with DuplexClient(
            f"ws://127.0.0.1:{port}/", timeout_s=2, reconnect=None, heartbeat_interval_s=None
        ) as client:
            with pytest.raises(DuplexProtocolError) as err:
                async for _ in client.events(timeout_s=2):
                    pass
            assert err.value.code == code
    except DuplexProtocolError:
        pass  # raised again by the close handshake: the same documented error
    finally:
        server.close()


async def test_peer_closing_mid_handshake():
    async def script(ws):
        await ws.close()

    port, server = await misbehaving(script)
    try:
        with pytest.raises(DuplexConnectionError, match="handshake"):
            async with DuplexClient(f"ws://127.0.0.1:{port}/", timeout_s=2, reconnect=None):
                pass
    finally:
        server.close()
