"""Phone calls over Twilio Media Streams, end to end: a simulated Twilio
(tests/twilio_peer.py) following the documented message sequence against
the real server and the cascade, with the session's log checked."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import httpx
import pytest
import websockets

from duplex_bench.twilio_peer import STREAM_PATH, TwilioPeer, from_mulaw, signature, to_mulaw
from duplex_server.engine.audio.sphinx import Sphinx
from duplex_server.sessions.core.records import AckBody, AudioBody, CallBody, CloseBody, ItemBody
from duplex_server.sessions.core.state import fold, initial_state
from duplex_server.sessions.log.sqlite_store import SqliteLog
from tests.e2e.serverproc import ServerProcess
from tests.speech import ANSWERS, PHRASES, silence, speak
from tests.wsclient import WsClient, tone_pcm16

TOKEN = "0123456789abcdef0123456789abcdef"
pytestmark = pytest.mark.server_config(twilio_auth_token=TOKEN, handshake_timeout_s=2.0)


def phone_speech(phrase: str, lead_ms: float = 300, tail_ms: float = 1000) -> bytes:
    """A spoken phrase in telephone-band mu-law (eSpeak at 8 kHz)."""
    return to_mulaw(silence(lead_ms, 8000) + speak(phrase, 8000) + silence(tail_ms, 8000), 8000)


async def until(check, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def call_up(server, peer: TwilioPeer):
    """The call's session, once the server opened it and named it by its sid."""
    await until(lambda: server.manager.actor_for_call(peer.call_sid) is not None)
    return server.manager.actor_for_call(peer.call_sid)


async def the_records(server, session_id: str) -> list:
    """A closed session's log (the memory store keeps it for the test)."""
    await until(lambda: session_id in server.final_records)
    return server.final_records[session_id]


async def test_a_spoken_question_is_answered_on_the_phone(voice_server):
    peer = await TwilioPeer.dial(voice_server.base, TOKEN, to="+15550000001", **{"from": "+1555"})
    actor = await call_up(voice_server, peer)
    app = await sideband(voice_server, peer.call_sid)  # OpenAI's endpoint, OpenAI's types
    await peer.speak(phone_speech(PHRASES[0]))
    await until(lambda: peer.played.marks_echoed and actor.state.response is None)
    await until(lambda: actor.state.last_response is not None and _played_all(actor))
    answer = from_mulaw(bytes(peer.played.audio), 16_000)
    assert Sphinx(ANSWERS).transcribe(answer) == f"you said {PHRASES[0]}"
    seen = [e["type"] for e in await app.recv_until("response.done")]
    assert "conversation.item.input_audio_transcription.completed" in seen
    assert not {"playback.acknowledged", "turn.event", "response.speak"} & set(seen), seen
    session_id = actor.session_id
    await peer.stop()
    await peer.closed()
    records = await the_records(voice_server, session_id)
    call = records[0].body
    assert isinstance(call, CallBody)
    assert (call.call_id, call.called, call.caller) == (peer.call_sid, "+15550000001", "+1555")
    inbound = [r.body for r in records if isinstance(r.body, AudioBody)]
    assert inbound and {a.source_format for a in inbound} == {"g711_ulaw"}
    assert {a.sample_rate_hz for a in inbound} == {8000}
    # 100 ms a record, not a record a 20 ms frame
    assert max(a.duration_ms for a in inbound) == pytest.approx(100.0)
    acks = [r.body for r in records if isinstance(r.body, AckBody) and r.body.what == "playback"]
    last = peer.played.marks_echoed[-1]
    assert acks[-1].played_ms == pytest.approx(float(last.rpartition("@")[2]))
    closes = [r.body for r in records if isinstance(r.body, CloseBody)]
    assert [c.reason for c in closes] == ["client_close"], closes


def _played_all(actor) -> bool:
    playback = actor.state.last_response.playback
    return playback.generated_ms > 0 and playback.played_ms >= playback.generated_ms - 1e-6


async def test_speech_over_the_answer_clears_it_and_truncates_at_the_last_mark(voice_server):
    peer = await TwilioPeer.dial(voice_server.base, TOKEN, to="+15550000001")
    actor = await call_up(voice_server, peer)
    await peer.speak(phone_speech(PHRASES[0], tail_ms=800))
    await until(lambda: len(peer.played.marks_echoed) >= 3)
    answering = actor.state.response
    assert answering is not None
    await peer.speak(phone_speech(PHRASES[2], lead_ms=0, tail_ms=1000))
    await until(lambda: peer.played.clears == 1)
    await until(lambda: actor.state.response is None or actor.state.response.id != answering.id)
    item = actor.state.find_item(answering.item_id)
    heard = [m for m in peer.played.marks_echoed if m.startswith(answering.id)]
    # History holds what the caller heard: the last mark echoed for its audio,
    # not the marks a clear handed back for audio that never played.
    assert peer.played.marks_dropped
    assert item.history_ms == pytest.approx(float(heard[-1].rpartition("@")[2]))
    assert item.history_ms < answering.playback.generated_ms
    await peer.hang_up()


async def test_a_key_press_is_logged_as_the_callers_input(voice_server):
    peer = await TwilioPeer.dial(voice_server.base, TOKEN, to="+15550000001")
    actor = await call_up(voice_server, peer)
    await peer.dtmf("3")
    await until(lambda: any(i.role == "user" for i in actor.state.items))
    (item,) = actor.state.items
    assert item.parts[0].text == "(the user pressed the 3 key)"
    records = await voice_server.app.state.log.read(actor.session_id)
    assert any(isinstance(r.body, ItemBody) for r in records)
    await peer.hang_up()
    await until(lambda: not voice_server.manager.actors)  # a dropped stream ends the call


async def test_bad_frames_are_dropped_and_the_call_goes_on(voice_server, caplog):
    peer = await TwilioPeer.dial(voice_server.base, TOKEN, to="+15550000001")
    actor = await call_up(voice_server, peer)
    await peer.send("{not json")
    await peer.send({"event": "surprise", "streamSid": peer.stream_sid})
    await peer.send(peer.media_frame(b"\xff" * 160, stream_sid="MZ_another_stream"))
    await peer.send(peer.media_frame(b"\xff" * 60_000))  # 7.5 s in one frame
    await peer.send({"event": "mark", "streamSid": peer.stream_sid, "mark": {"name": "mine"}})
    await peer.send(
        {"event": "media", "streamSid": peer.stream_sid, "media": {"payload": "!!not base64"}}
    )
    await peer.speak(phone_speech(PHRASES[3]))
    await until(lambda: actor.state.last_response is not None and _played_all(actor))
    answer = from_mulaw(bytes(peer.played.audio), 16_000)
    assert Sphinx(ANSWERS).transcribe(answer) == f"you said {PHRASES[3]}"
    logged = caplog.text
    for reason in ("unreadable", "another stream", "oversized", "did not send", "not base64"):
        assert reason in logged, reason
    assert "+15550000001" not in logged
    await peer.hang_up()


async def test_media_before_start_is_dropped_and_a_silent_stream_is_closed(voice_server):
    url = f"ws://{voice_server.base}{STREAM_PATH}"
    headers = {"X-Twilio-Signature": signature(TOKEN, url)}
    async with websockets.connect(url, additional_headers=headers) as socket:
        await socket.send('{"event": "connected", "protocol": "Call", "version": "1.0.0"}')
        await socket.send(
            '{"event": "media", "streamSid": "MZ1", "media": {"payload": "/////w=="}}'
        )
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(socket.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert not voice_server.manager.actors


async def test_the_stream_refuses_an_unsigned_or_wrongly_signed_upgrade(voice_server):
    url = f"ws://{voice_server.base}{STREAM_PATH}"
    for headers in ({}, {"X-Twilio-Signature": signature("another-token-altogether", url)}):
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url, additional_headers=headers)
        assert refused.value.response.status_code == 403
    assert not voice_server.manager.actors


async def test_the_voice_webhook_connects_the_call_to_the_stream(voice_server):
    url = f"http://{voice_server.base}/v1/telephony/twilio/voice"
    form = {"CallSid": "CA1", "From": "+15551230000", "To": "+15550000001"}
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            url, data=form, headers={"X-Twilio-Signature": signature(TOKEN, url, form)}
        )
        refused = await http.post(url, data=form, headers={"X-Twilio-Signature": "bogus"})
    assert answer.status_code == 200, answer.text
    assert f'url="ws://{voice_server.base}{STREAM_PATH}"' in answer.text
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "invalid_signature"


@pytest.mark.server_config(handshake_timeout_s=2.0)
async def test_without_a_token_the_telephony_routes_are_not_there(voice_server):
    url = f"ws://{voice_server.base}{STREAM_PATH}"
    with pytest.raises(websockets.InvalidStatus) as refused:
        await websockets.connect(url, additional_headers={"X-Twilio-Signature": "x"})
    assert refused.value.response.status_code == 404


async def sideband(server, call_id: str) -> WsClient:
    return await WsClient.connect(f"ws://{server.base}/v1/realtime?call_id={call_id}")


async def test_a_server_application_watches_and_steers_the_call(voice_server):
    peer = await TwilioPeer.dial(voice_server.base, TOKEN, to="+15550000001")
    actor = await call_up(voice_server, peer)
    app = await sideband(voice_server, peer.call_sid)
    await app.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    updated = await app.expect("session.updated")
    assert updated["session"]["instructions"] == "Be brief."
    assert actor.state.config.instructions == "Be brief."
    # The caller's key press reaches the application as the call's event.
    await peer.dtmf("7")
    pressed = (await app.recv_until("input_audio_buffer.dtmf_event_received"))[-1]
    assert pressed["event"] == "7" and pressed["received_at"] > 1_700_000_000
    added = await app.expect("conversation.item.added")
    assert added["item"]["content"][0]["text"] == "(the user pressed the 7 key)"
    # It steers; it cannot stream audio into the call.
    await app.send({"type": "input_audio_buffer.append", "audio": "AAAA", "event_id": "evt_x"})
    refused = (await app.recv_until("error"))[-1]
    assert refused["error"]["code"] == "sideband_event_not_allowed"
    assert refused["error"]["event_id"] == "evt_x"
    await app.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
        }
    )
    await app.recv_until("conversation.item.added")
    assert [i.parts[0].text for i in actor.state.items][-1] == "hi"
    # By the session's id as well as the call's.
    other = await sideband(voice_server, actor.session_id)
    await peer.stop()
    await peer.closed()
    for socket in (app, other):  # the call's end closes its sideband sockets
        await socket.recv_until("session.closed")
    await until(lambda: not voice_server.manager.actors)


async def test_a_sideband_socket_for_no_call_is_refused(voice_server):
    app = await sideband(voice_server, "CA_nobody")
    refused = await app.expect("error")
    assert refused["error"]["code"] == "call_not_found"
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await app.ws.recv()
    assert closed.value.rcvd.code == 1008


async def session_of_call(server, call_sid: str) -> str:
    """The call's session id, asked over its sideband once the call is up
    (until then the sideband is refused ``call_not_found`` and closed)."""
    for _ in range(100):
        app = await sideband(server, call_sid)
        try:
            await app.send({"type": "session.update", "session": {}})
            answer = (await app.recv_until("session.updated", "error"))[-1]
        except websockets.ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.reason == "call_not_found", closed
            answer = {"type": "error", "error": {"code": "call_not_found"}}
        await app.close()
        if answer["type"] == "session.updated":
            return answer["session"]["id"]
        assert answer["error"]["code"] == "call_not_found"
        await asyncio.sleep(0.05)
    raise AssertionError("the call never came up")


def the_log(server: ServerProcess, session_id: str) -> list[dict]:
    url = f"{server.http_url}/v1/sessions/{session_id}/events"
    with urllib.request.urlopen(url, timeout=10) as response:
        return [json.loads(line) for line in response.read().splitlines()]


async def test_a_call_on_a_server_killed_mid_call_is_ended_at_restart(tmp_path):
    """kill -9 mid-call, restart on SQLite: the log refolds and the call's
    session is ended at once (no carrier streams it again), not left to
    wait out the disconnect grace for a resume that never comes."""
    db = f"sqlite:{tmp_path / 'calls.db'}"
    flags = {"twilio_auth_token": TOKEN, "disconnect_grace_s": 600}
    first = ServerProcess(db, **flags).start()
    try:
        peer = await TwilioPeer.dial(first.base, TOKEN, to="+15550000001", **{"from": "+1555012"})
        session_id = await session_of_call(first, peer.call_sid)
        await peer.speak(to_mulaw(tone_pcm16(400, 8000), 8000))
        lines = the_log(first, session_id)
        assert lines[0]["body"] == {
            "kind": "call",
            "carrier": "twilio",
            "call_id": peer.call_sid,
            "stream_id": peer.stream_sid,
            "caller": "+1555012",
            "called": "+15550000001",
        }
        first.kill9()
    finally:
        first.stop()
    second = ServerProcess(db, **flags, port=first.port).start()
    try:
        lines = the_log(second, session_id)
        assert lines[-1]["body"]["kind"] == "close"
        assert lines[-1]["body"]["reason"] == "disconnect"
        with urllib.request.urlopen(f"{second.http_url}/v1/sessions/{session_id}") as answer:
            assert json.loads(answer.read())["state"] == "closed"
        records = await second_log_records(db, session_id)
        state = fold(records, initial_state(session_id, "echo", ()))
        assert state.closed_reason == "disconnect" and state.call is not None
    finally:
        second.stop()


async def second_log_records(db: str, session_id: str) -> list:
    store = SqliteLog(db.removeprefix("sqlite:"), "group")
    try:
        return await store.read(session_id)
    finally:
        await store.close()
