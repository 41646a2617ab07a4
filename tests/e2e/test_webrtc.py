"""WebRTC calls end to end: an aiortc client dialling ``POST /v1/realtime/calls``
as OpenAI's WebRTC guide has a browser do it, against the real server and the
cascade (its recogniser listening for the test phrases), the answer heard on
the remote track and recognised back, the data channel's events checked
against the openai SDK's models and the session's log read back."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets
from aiortc import RTCPeerConnection

from duplex_bench.server_process import free_port
from duplex_bench.webrtc_peer import CallRefused, WebRtcPeer, post_offer
from duplex_server.config import ServerConfig
from duplex_server.engine.audio.sphinx import Sphinx
from duplex_server.sessions.core.records import AckBody, AudioBody, CallBody, CloseBody
from duplex_server.sessions.core.state import fold, initial_state
from duplex_server.surface import resample_pcm16
from tests import openai_conformance
from tests.conftest import running_server
from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_keys import bearer, keys_file
from tests.e2e.test_twilio_calls import second_log_records, the_records, until
from tests.speech import ANSWERS, PHRASES, silence, speak
from tests.wsclient import WsClient

RATE = 24_000


def spoken(phrase: str, lead_ms: float = 300, tail_ms: float = 1200) -> bytes:
    return silence(lead_ms, RATE) + speak(phrase, RATE) + silence(tail_ms, RATE)


def heard_words(peer: WebRtcPeer, start: int = 0) -> str:
    """What the recogniser makes of the audio the caller's track received."""
    return Sphinx(ANSWERS).transcribe(resample_pcm16(bytes(peer.heard.audio[start:]), RATE, 16000))


def check_events(peer: WebRtcPeer) -> None:
    """Every data channel event validates against the openai SDK's GA models
    (no extension types: the channel is OpenAI's endpoint)."""
    for event in peer.events:
        found = openai_conformance.check_event(json.dumps(event), "ga", extensions=False)
        assert found is None, found


def the_call(server, peer: WebRtcPeer):
    return server.manager.actor_for_call(peer.call_id)


async def answered(peer: WebRtcPeer, actor, after: int = 0) -> dict:
    """The answer's response.done, once its audio was all put on the wire."""
    done = await peer.next_event("response.done", after=after, timeout_s=40)
    await until(lambda: actor.state.last_response is not None and _sent_all(actor))
    await asyncio.sleep(0.3)  # the last frames' way to the caller
    return done


def _sent_all(actor) -> bool:
    playback = actor.state.last_response.playback
    return playback.generated_ms > 0 and playback.played_ms >= playback.generated_ms - 1e-6


async def test_a_spoken_question_is_answered_on_the_track(voice_server):
    peer = await WebRtcPeer.call(voice_server.http_url)
    actor = the_call(voice_server, peer)
    assert actor is not None
    assert peer.events[0]["type"] == "session.created"
    peer.speak(spoken(PHRASES[0]))
    await answered(peer, actor)
    assert heard_words(peer) == f"you said {PHRASES[0]}"
    kinds = peer.types()
    assert "response.output_audio.delta" not in kinds  # the audio is on the track
    assert "response.output_audio_transcript.delta" in kinds
    assert kinds.index("output_audio_buffer.started") < kinds.index("output_audio_buffer.stopped")
    assert "playback.acknowledged" not in kinds
    check_events(peer)
    session_id = actor.session_id
    await peer.hang_up()
    records = await the_records(voice_server, session_id)
    call = records[0].body
    assert isinstance(call, CallBody) and (call.carrier, call.call_id) == ("webrtc", peer.call_id)
    inbound = [r.body for r in records if isinstance(r.body, AudioBody)]
    assert {(a.source_format, a.sample_rate_hz) for a in inbound} == {("pcm16", RATE)}
    assert max(a.duration_ms for a in inbound) == pytest.approx(100.0)
    acks = [r.body for r in records if isinstance(r.body, AckBody) and r.body.what == "playback"]
    generated = actor.state.last_response.playback.generated_ms
    assert acks and acks[-1].played_ms == pytest.approx(generated)


async def test_the_offers_session_config_is_in_force_from_the_first_event(voice_server):
    session = {"type": "realtime", "instructions": "answer in one word"}
    peer = await WebRtcPeer.call(voice_server.http_url, session=session)
    created = peer.events[0]
    assert created["type"] == "session.created"
    assert created["session"]["instructions"] == "answer in one word"
    check_events(peer)
    await peer.hang_up()


async def test_speech_over_the_answer_cuts_the_track_and_truncates_at_what_was_sent(
    voice_server,
):
    peer = await WebRtcPeer.call(voice_server.http_url)
    actor = the_call(voice_server, peer)
    peer.speak(spoken(PHRASES[0], tail_ms=900))
    await peer.next_event("output_audio_buffer.started", timeout_s=40)
    answering = actor.state.response
    assert answering is not None
    peer.speak(spoken(PHRASES[2], lead_ms=0))
    cleared = await peer.next_event("output_audio_buffer.cleared", timeout_s=30)
    assert cleared["response_id"] == answering.id
    call = voice_server.app.state.rtc_calls.by_id[peer.call_id]
    sent = call.track.sent
    assert sent is not None and sent.response_id == answering.id
    await until(lambda: actor.state.find_item(answering.item_id).truncated)
    item = actor.state.find_item(answering.item_id)
    # History holds what went on the wire, to the frame, and no more.
    assert item.history_ms == pytest.approx(sent.ms)
    assert item.history_ms < answering.playback.generated_ms
    # The track is silent from the cut: nothing of the cut answer is queued.
    assert call.track.queued_ms == 0 or actor.state.response is not None
    check_events(peer)
    await peer.hang_up()


async def test_hangup_ends_the_call_and_its_session(voice_server):
    peer = await WebRtcPeer.call(voice_server.http_url)
    actor = the_call(voice_server, peer)
    async with httpx.AsyncClient() as http:
        missing = await http.post(f"{voice_server.http_url}/v1/realtime/calls/rtc_nope/hangup")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "call_not_found"
        hung = await http.post(f"{voice_server.http_url}{peer.location}/hangup")
    assert hung.status_code == 200
    closed = await peer.next_event("session.closed", timeout_s=10)
    assert closed["type"] == "session.closed"
    records = await the_records(voice_server, actor.session_id)
    assert [r.body.reason for r in records if isinstance(r.body, CloseBody)] == ["client_close"]
    await until(lambda: peer.call_id not in voice_server.app.state.rtc_calls.by_id)
    await peer.hang_up()


async def test_the_sideband_sees_the_call_and_steers_it(voice_server):
    peer = await WebRtcPeer.call(voice_server.http_url)
    app = await WsClient.connect(f"ws://{voice_server.base}/v1/realtime?call_id={peer.call_id}")
    await app.send({"type": "session.update", "session": {"instructions": "be brief"}})
    updated = await peer.next_event("session.updated", timeout_s=10)
    assert updated["session"]["instructions"] == "be brief"
    peer.speak(spoken(PHRASES[1]))
    seen = [e["type"] for e in await app.recv_until("response.done", timeout=40)]
    assert {"input_audio_buffer.committed", "response.output_audio_transcript.done"} <= set(seen)
    assert "playback.acknowledged" not in seen  # OpenAI's types only, unless asked
    await app.close()
    await peer.hang_up()


@pytest.mark.server_config(api_key="sk-test-key-0123456789")
async def test_bad_offers_are_refused_in_openais_shape_and_nothing_else_moves(server):
    base, key = server.http_url, "sk-test-key-0123456789"
    good = await WebRtcPeer.call(base, key=key)
    offer = good.pc.localDescription.sdp
    no_audio = "\r\n".join(line for line in offer.splitlines() if "audio" not in line)
    no_opus = offer.replace("opus/48000", "speex/48000")
    refusals = [
        (await post_offer(base, offer, key="sk-wrong"), 401, "unauthorized"),
        (await post_offer(base, "hello", key=key), 400, "invalid_offer"),
        (await post_offer(base, offer.split("m=audio")[0], key=key), 400, "invalid_offer"),
        (await post_offer(base, no_audio, key=key), 400, "invalid_offer"),
        (await post_offer(base, no_opus, key=key), 400, "unsupported_codec"),
        (await post_offer(base, offer, key=key, content_type="text/plain"), 415, None),
        (await post_offer(base, offer + "a=x\r\n" * 20_000, key=key), 413, "payload_too_large"),
    ]
    for response, status, code in refusals:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["message"] and error["type"]
        if code is not None:
            assert error["code"] == code
    async with httpx.AsyncClient() as http:
        headers = {"Authorization": f"Bearer {key}"}
        unknown = await http.post(f"{base}/v1/realtime/calls/rtc_0/hangup", headers=headers)
    assert unknown.status_code == 404
    # The call up before all this still answers.
    good.send({"type": "conversation.item.create", "item": _text_item("hello")})
    await good.next_event("conversation.item.added", timeout_s=10)
    assert len(server.app.state.rtc_calls.by_id) == 1
    await good.hang_up()


def _text_item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def test_a_hangup_of_another_keys_call_is_forbidden(tmp_path):
    path, keys = keys_file(tmp_path, alice=(["realtime"], 0), bob=(["realtime"], 0))
    config = ServerConfig(port=free_port(), model="echo", store="memory", api_keys_file=path)
    async with running_server(config) as server:
        peer = await WebRtcPeer.call(server.http_url, key=keys["alice"])
        async with httpx.AsyncClient() as http:
            url = f"{server.http_url}{peer.location}/hangup"
            refused = await http.post(url, headers=bearer(keys["bob"]))
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "forbidden"
            assert peer.call_id in server.app.state.rtc_calls.by_id  # still up
            hung = await http.post(url, headers=bearer(keys["alice"]))
        assert hung.status_code == 200
        await peer.next_event("session.closed", timeout_s=10)
        await peer.hang_up()


async def test_a_refused_call_leaves_no_peer_connection(server):
    with pytest.raises(CallRefused):
        await WebRtcPeer.call(server.http_url, session={"type": "realtime", "voice": 7})
    assert not server.app.state.rtc_calls.by_id
    assert not server.manager.actors


async def test_a_call_goes_on_after_kill_9_with_a_new_offer_naming_it(tmp_path):
    """The server dies mid-call; restarted on the same SQLite file, a new
    offer with the session's id, resume token and last event seq continues
    the conversation: the first turn is in its history, no event twice."""
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("\n".join(PHRASES))
    store = f"sqlite:{tmp_path / 'sessions.db'}"
    flags = {"model": "cascade", "asr_phrases": str(phrases), "disconnect_grace_s": 60}
    first = ServerProcess(store, **flags).start()
    try:
        peer = await WebRtcPeer.call(first.http_url)
        created = peer.events[0]
        peer.speak(spoken(PHRASES[0]))
        await peer.next_event("response.done", timeout_s=40)
        await asyncio.sleep(0.5)
        first.kill9()
    finally:
        first.stop()
    await peer.close()
    last_seq = max(e["server_event_seq"] for e in peer.events if e.get("server_event_seq"))
    second = ServerProcess(store, port=first.port, **flags).start()
    try:
        query = (
            f"session_id={created['session']['id']}&resume_token={created['resume_token']}"
            f"&last_received_server_event_seq={last_seq}"
        )
        again = await WebRtcPeer.call(second.http_url, query=query)
        assert again.call_id == peer.call_id  # the same call, under its id
        resumed = await again.next_event("session.resumed", timeout_s=10)
        assert resumed["session"]["id"] == created["session"]["id"]
        again.speak(spoken(PHRASES[1]))
        done = await again.next_event("response.done", timeout_s=40)
        await asyncio.sleep(1.0)
        assert heard_words(again) == f"you said {PHRASES[1]}"
        assert done["response"]["status"] == "completed"
        seqs = [e["server_event_seq"] for e in again.events if e.get("server_event_seq")]
        assert seqs and min(seqs) > last_seq  # nothing the first channel had, again
        check_events(again)
        await again.hang_up()
    finally:
        second.stop()
    records = await second_log_records(store, created["session"]["id"])
    state = fold(records, initial_state(created["session"]["id"], "cascade", ("server_vad",)))
    assert [item.role for item in state.items] == ["user", "assistant"] * 2
    assert state.closed_reason == "client_close"


async def test_media_binds_in_the_port_range_and_names_the_configured_host():
    from aioice.ice import get_host_addresses

    host = get_host_addresses(use_ipv4=True, use_ipv6=False)[0]
    config = ServerConfig(
        port=free_port(), model="echo", store="memory", rtc_host=host, rtc_udp_ports="40100-40120"
    )
    async with running_server(config) as server:
        peers = [await WebRtcPeer.call(server.http_url) for _ in range(2)]
        for peer in peers:
            candidates = [
                line.split()
                for line in peer.pc.remoteDescription.sdp.splitlines()
                if line.startswith("a=candidate:")
            ]
            assert candidates
            assert {c[4] for c in candidates} == {host}
            assert all(40100 <= int(c[5]) <= 40120 for c in candidates)
            peer.send({"type": "conversation.item.create", "item": _text_item("hi")})
            await peer.next_event("conversation.item.added", timeout_s=10)
        answers = [peer.pc.remoteDescription.sdp for peer in peers]
        ports = {sdp.split("a=candidate:")[1].split()[5] for sdp in answers}
        assert len(ports) == 2  # a socket a call
        for peer in peers:
            await peer.hang_up()


async def offer_only(base: str, **kwargs):
    """An offer posted by a client that never applies the answer (so never
    connects): the peer connection to close, and the server's answer."""
    pc = RTCPeerConnection()
    pc.createDataChannel("oai-events")
    pc.addTransceiver("audio", direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, await post_offer(base, pc.localDescription.sdp, **kwargs)


@pytest.mark.server_config(max_calls_in_setup=1, rtc_connect_timeout_s=1.0)
async def test_a_call_that_never_connects_is_closed_and_holds_its_setup_slot_until_then(
    server,
):
    pc, answered = await offer_only(server.http_url)
    assert answered.status_code == 201
    busy_pc, busy = await offer_only(server.http_url)
    assert busy.status_code == 503 and busy.headers["retry-after"]
    assert busy.json()["error"]["code"] == "resource_exhausted"
    await busy_pc.close()
    await until(lambda: not server.app.state.rtc_calls.by_id)  # the connect deadline
    (actor,) = server.manager.actors.values()
    assert not actor.state.lease.attached  # its session waits for a new offer
    peer = await WebRtcPeer.call(server.http_url)  # the slot is free again
    await peer.hang_up()
    await pc.close()


@pytest.mark.server_config(max_sessions=1)
async def test_a_call_counts_as_a_session(server):
    peer = await WebRtcPeer.call(server.http_url)
    with pytest.raises(CallRefused) as refused:
        await WebRtcPeer.call(server.http_url)
    assert refused.value.status == 503
    with pytest.raises(websockets.InvalidStatus) as full:  # nor may a socket open one
        await WsClient.connect(server.ws_url)
    assert full.value.response.status_code == 503
    assert json.loads(full.value.response.body)["error"]["code"] == "resource_exhausted"
    await peer.hang_up()


async def test_a_new_offer_takes_the_session_over_from_a_live_call(server):
    first = await WebRtcPeer.call(server.http_url)
    created = first.events[0]
    first.send({"type": "conversation.item.create", "item": _text_item("one")})
    await first.next_event("conversation.item.added", timeout_s=10)
    last_seq = max(e["server_event_seq"] for e in first.events if e.get("server_event_seq"))
    query = (
        f"session_id={created['session']['id']}&resume_token={created['resume_token']}"
        f"&last_received_server_event_seq={last_seq}"
    )
    before = server.app.state.rtc_calls.by_id[first.call_id]
    second = await WebRtcPeer.call(server.http_url, query=query)  # a network change
    await second.next_event("session.resumed", timeout_s=10)
    await first.next_event("session.replaced", timeout_s=10)
    await until(lambda: first.pc.connectionState == "closed")
    second.send({"type": "conversation.item.create", "item": _text_item("two")})
    added = await second.next_event("conversation.item.added", timeout_s=10)
    assert added["item"]["content"][0]["text"] == "two"
    now = server.app.state.rtc_calls.by_id[first.call_id]  # the same call, a new connection
    assert now is not before and before.ended
    await second.hang_up()
    await first.close()


async def test_a_dropped_connection_leaves_the_session_waiting_for_a_new_offer(server):
    first = await WebRtcPeer.call(server.http_url)
    created = first.events[0]
    actor = the_call(server, first)
    first.send({"type": "conversation.item.create", "item": _text_item("before")})
    await first.next_event("conversation.item.added", timeout_s=10)
    last_seq = max(e["server_event_seq"] for e in first.events if e.get("server_event_seq"))
    await first.close()  # the tab died: no hangup
    await until(lambda: not actor.state.lease.attached)
    assert actor.state.closed_reason is None  # it waits out the grace
    session = {
        "session_id": created["session"]["id"],
        "resume_token": created["resume_token"],
        "last_received_server_event_seq": last_seq,
    }
    again = await WebRtcPeer.call(server.http_url, session=session)  # OpenAI's form
    await again.next_event("session.resumed", timeout_s=10)
    again.send({"type": "conversation.item.create", "item": _text_item("after")})
    await again.next_event("conversation.item.added", timeout_s=10)
    assert [item.parts[0].text for item in actor.state.items] == ["before", "after"]
    await again.hang_up()
