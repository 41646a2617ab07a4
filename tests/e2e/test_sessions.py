"""Session lifecycle: handshake, updates, heartbeat, close, admission, expiry."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from duplex_server.sessions.core.records import SignalBody
from tests.wsclient import WsClient, tone_pcm16


async def test_autostart_announces_session(server):
    client, created = await server.open()
    session = created["session"]
    assert created["server_event_seq"] is None  # attachment-scoped, never replayed
    assert created["attachment_generation"] == 1
    assert len(created["resume_token"]) >= 22  # 128 bits, urlsafe base64
    assert session["id"].startswith("sess_") and session["state"] == "open"
    assert session["turn_state"] == "listening"
    assert session["playback"] == {
        "generated_ms": 0.0,
        "sent_ms": 0.0,
        "played_ms": 0.0,
        "committed_ms": 0.0,
    }
    assert session["turn_detection"] is None
    assert session["capabilities"]["implementation_level"] == "loopback"


async def test_handshake_with_autostart_off(server):
    client = await server.connect("autostart=0")
    await client.send({"type": "input_audio_buffer.commit", "event_id": "early"})
    error = await client.expect("error")
    assert error["error"]["code"] == "session_not_open"
    await client.send(
        {"type": "session.update", "session": {"instructions": "be brief", "voice": "alloy"}}
    )
    created = await client.expect("session.created")
    updated = await client.expect("session.updated")
    assert created["session"]["instructions"] == "be brief"
    assert updated["session"]["voice"] == "alloy" and updated["server_event_seq"] == 1


@pytest.mark.server_config(served_model_name=["echo", "echo-custom"])
async def test_model_query_parameter(server):
    """session.created reports the name the client asked for, as OpenAI does,
    when the model answers to it: a served name or an OpenAI alias."""
    client, created = await server.open("model=echo-custom")
    assert created["session"]["model"] == "echo-custom"
    client, created = await server.open("model=gpt-realtime-2025-08-28")
    assert created["session"]["model"] == "gpt-realtime-2025-08-28"


async def test_a_model_that_is_not_served_is_refused(server):
    """On the OpenAI endpoint, as OpenAI refuses a model it does not serve;
    the duplex wire announces any name its clients give, as before."""
    client, created = await server.open("model=llama-9")
    assert created["session"]["model"] == "llama-9"
    client = await WsClient.connect(f"ws://{server.base}/v1/realtime?autostart=0")
    await client.send({"type": "session.update", "event_id": "m1", "session": {"model": "llama-9"}})
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"], error["event_id"]) == (
        "model_not_found",
        "session.model",
        "m1",
    )
    # the socket stays: a better update opens the session
    await client.send({"type": "session.update", "session": {"model": "echo"}})
    assert (await client.expect("session.created"))["session"]["model"] == "echo"


async def test_session_update_accepts_both_spellings(server):
    client, _ = await server.open()
    await client.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {
                    "input": {"format": {"type": "audio/pcmu"}},
                    "output": {
                        "format": {"type": "audio/pcm", "rate": 16000},
                        "voice": "v2",
                        "speed": 1.25,
                    },
                },
                "overlap_policy": "listen_only",
                "idle_timeout_s": 60,
            },
        }
    )
    session = (await client.expect("session.updated"))["session"]
    assert session["modalities"] == ["text"]
    assert session["input_audio_format"] == "g711_ulaw"
    assert session["audio"]["input"]["format"] == {"type": "audio/pcmu", "rate": 8000}
    # OpenAI's format object says pcm only at 24 kHz: the true format is in duplex
    assert session["audio"]["output"]["format"] is None
    assert session["duplex"]["output_format"] == {"type": "pcm16", "rate": 16000}
    assert (session["voice"], session["speed"]) == ("v2", 1.25)
    assert session["overlap_policy"] == "listen_only" and session["idle_timeout_s"] == 60


async def test_unsupported_turn_detection(server):
    client, _ = await server.open()
    await client.send(
        {
            "type": "session.update",
            "event_id": "u1",
            "session": {"turn_detection": {"type": "server_vad"}},
        }
    )
    error = await client.expect("error")
    assert error["error"]["code"] == "unsupported_turn_detection"
    assert error["error"]["event_id"] == "u1"
    await client.send({"type": "session.update", "session": {"turn_detection": None}})
    assert (await client.expect("session.updated"))["session"]["turn_detection"] is None


async def test_heartbeat(server):
    client, _ = await server.open()
    await client.send({"type": "session.heartbeat"})
    ack = await client.expect("session.heartbeat_ack")
    # Attachment-scoped (PROTOCOL.md): no seq, so never replayed to another socket.
    assert ack["epoch"] == 0 and ack["server_event_seq"] is None


async def test_heartbeats_are_answered_in_order_and_never_recorded(server):
    """A heartbeat is the socket's liveness signal (docs/decisions/wire.md): its ack
    follows the answers to everything sent before it, and the log keeps none."""
    client, created = await server.open()
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "session.heartbeat"})
    before_ack = [event["type"] for event in await client.recv_until("session.heartbeat_ack")]
    assert "input_audio_buffer.committed" in before_ack
    ids = set()
    for _ in range(5):
        await client.send({"type": "session.heartbeat"})
        ids.add((await client.recv_until("session.heartbeat_ack"))[-1]["event_id"])
    assert len(ids) == 5
    records = await server.app.state.log.read(created["session"]["id"])  # type: ignore[attr-defined]
    signals = [r.body.signal for r in records if isinstance(r.body, SignalBody)]
    assert records and "heartbeat" not in signals


async def test_close_is_graceful(server):
    client, created = await server.open()
    await client.send({"type": "session.close"})
    closed = await client.expect("session.closed")
    assert closed["reason"] == "client_close"
    with pytest.raises(websockets.ConnectionClosedOK):
        await client.recv(timeout=5)
    session_id = created["session"]["id"]
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        detail = (await http.get(f"/v1/sessions/{session_id}")).json()
    assert detail == {"id": session_id, "state": "closed", "reason": "client_close"}


async def test_close_mid_response_cancels_it(server):
    client, _ = await server.open()
    await client.send({"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 40}}})
    await client.expect("session.updated")
    await client.append(tone_pcm16(2000))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.recv_until("response.output_audio.delta")
    await client.send({"type": "session.close"})
    events = await client.recv_until("session.closed")
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "cancelled"


@pytest.mark.server_config(max_sessions=1)
async def test_admission_limit(server):
    """A full server answers the upgrade itself: 503 with Retry-After and
    OpenAI's error body, no socket; a resume is still let through."""
    first, _ = await server.open()
    with pytest.raises(websockets.InvalidStatus) as refused:
        await server.connect()
    answer = refused.value.response
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
    error = json.loads(answer.body)["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "resource_exhausted")
    assert "capacity" in error["message"]
    # a socket that opens no session at connect (it may resume) is upgraded;
    # a session it then asks for is refused on the socket, as OpenAI's are
    later = await WsClient.connect(server.ws_url + "&autostart=0")
    await later.send({"type": "session.update", "session": {}})
    error = await later.expect("error")
    assert error["error"]["code"] == "resource_exhausted"
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await later.recv(timeout=5)
    assert closed.value.rcvd.code == 1013
    await first.send({"type": "session.close"})
    await first.expect("session.closed")
    for _ in range(100):  # the slot frees when the actor has finished closing
        if not server.manager.actors:
            break
        await asyncio.sleep(0.05)
    third, _ = await server.open()  # capacity is given back on close


@pytest.mark.server_config(idle_ttl_s=1.5, reap_interval_s=0.05)
async def test_idle_ttl_expires_and_heartbeat_keeps_alive(server):
    # Heartbeats every 0.2 s against a 1.5 s TTL: a wide margin on a loaded machine,
    # and the run (2.4 s) still outlasts the TTL.
    kept, _ = await server.open()
    idle, _ = await server.open()
    for _ in range(12):
        await asyncio.sleep(0.2)
        await kept.send({"type": "session.heartbeat"})
        await kept.expect("session.heartbeat_ack")
    expired = await idle.expect("session.expired")
    assert expired["reason"] == "idle_ttl_expired"
    with pytest.raises(websockets.ConnectionClosed):
        await idle.recv(timeout=5)
    await kept.send({"type": "session.heartbeat"})
    await kept.expect("session.heartbeat_ack")


@pytest.mark.server_config(disconnect_grace_s=0.3, reap_interval_s=0.05)
async def test_disconnect_grace_expires(server):
    client, created = await server.open()
    await client.close()
    await asyncio.sleep(0.7)
    late = await server.connect("autostart=0")
    await late.send(
        {
            "type": "session.resume",
            "session_id": created["session"]["id"],
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": 0,
        }
    )
    error = await late.expect("error")
    assert error["error"]["code"] == "session_resume_expired"
    records = server.final_states[created["session"]["id"]]
    assert records.closed_reason == "disconnect_grace_expired"


async def test_shutdown_tells_attached_clients(server):
    client, _ = await server.open()
    await server.manager.shutdown()
    if server.app.state.log.durable:
        # The session outlives the process: the client is told to come back.
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await client.recv(timeout=5)
        assert closed.value.rcvd.code == 1012
    else:
        closed = await client.expect("session.closed")
        assert closed["reason"] == "shutdown"


@pytest.mark.server_config(api_key="sekrit")
async def test_api_key(server):
    # refused before the upgrade (issue 16): an HTTP 401, no half-open socket
    with pytest.raises(websockets.InvalidStatus) as denied:
        await WsClient.connect(server.ws_url)
    assert denied.value.response.status_code == 401
    assert b'"unauthorized"' in denied.value.response.body
    allowed = await WsClient.connect(
        server.ws_url, additional_headers={"Authorization": "Bearer sekrit"}
    )
    await allowed.expect("session.created")
    browser = await WsClient.connect(
        server.ws_url, subprotocols=["realtime", "openai-insecure-api-key.sekrit"]
    )
    await browser.expect("session.created")
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        assert (await http.get("/v1/sessions/x/events")).status_code == 401
        ok = await http.get("/v1/sessions/x/events", headers={"Authorization": "Bearer sekrit"})
        assert ok.status_code == 404


@pytest.mark.server_config(idle_ttl_s=0.6, reap_interval_s=0.05)
async def test_expiry_cuts_a_streaming_answer_as_session_ended(server):
    client, _ = await server.open()
    await client.send(
        {"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 200}}}
    )
    await client.append(tone_pcm16(5000))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("session.expired")
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert (done["status"], done["duplex"]["reason"]) == ("incomplete", "session_ended")
