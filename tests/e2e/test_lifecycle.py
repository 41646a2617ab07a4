"""Response lifecycle, in the exact orders of PROTOCOL.md, over a real socket."""

from __future__ import annotations

import asyncio
import base64

import pytest

from tests.e2e.sequences import (
    AUDIO_CHUNK,
    COMMIT_FANOUT,
    RESPONSE_CLOSE,
    RESPONSE_OPEN,
    TEXT_CLOSE,
    TURN_EVENT,
    answer_audio,
    full_turn,
)
from tests.wsclient import WsClient, tone_pcm16, types_of


async def slow_session(server, delay_ms: float = 40.0) -> WsClient:
    """A session whose echo streams one chunk per ``delay_ms``, so it can be interrupted."""
    client, _ = await server.open()
    await client.send(
        {"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": delay_ms}}}
    )
    await client.expect("session.updated")
    return client


async def start_long_response(client: WsClient, ms: float = 2000) -> dict:
    await client.append(tone_pcm16(ms))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("response.output_audio.delta")
    return next(e for e in events if e["type"] == "response.created")["response"]


async def assert_quiet(client: WsClient) -> list[dict]:
    """Nothing stale arrives: a heartbeat's ack is the next event after a pause."""
    await asyncio.sleep(0.3)
    await client.send({"type": "session.heartbeat"})
    return await client.recv_until("session.heartbeat_ack")


async def test_full_turn_in_documented_order(server):
    client, _ = await server.open()
    await client.append(tone_pcm16(300))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    assert types_of(events) == full_turn(3)
    seqs = [e["server_event_seq"] for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    committed = events[0]["event"]  # input_audio_buffer.committed opens the fan-out
    assert committed["turn_id"] == 1 and committed["response_create_deferred"] is False
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )
    assert len(audio) == len(tone_pcm16(300))
    done = events[-2]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["id"] == f"item_{done['id']}"
    assert done["duplex"]["playback"]["generated_ms"] == 300.0
    # turn.event: the floor passes to the assistant, which plays its answer
    # until the client says it played all of it; then nobody holds it
    assert [e["event"] for e in events if e["type"] == TURN_EVENT] == [
        "assistant_generating",
        "assistant_playing",
    ]
    # the first ack: the output buffer started playing; the last: it stopped
    await client.send({"type": "playback.ack", "played_ms": 150.0})
    started = await client.recv_until("playback.acknowledged")
    assert types_of(started) == ["output_audio_buffer.started", "playback.acknowledged"]
    await client.send({"type": "playback.ack", "played_ms": 300.0})
    acked = await client.recv_until(TURN_EVENT)
    assert types_of(acked) == [
        "playback.acknowledged",
        "output_audio_buffer.stopped",
        TURN_EVENT,
    ]
    assert acked[-1]["event"] == "idle"


async def test_an_ack_of_the_rounded_ledger_plays_the_answer_to_its_end(server):
    """The wire's ledger is rounded to microseconds: 2,402 samples are
    100.0833… ms, told as 100.083. A client (or a WebRTC call's track) that
    acks what it was told has played the answer through."""
    client, _ = await server.open()
    await client.append(tone_pcm16(100) + b"\x10\x00" * 2)
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    told = events[-2]["response"]["duplex"]["playback"]["generated_ms"]
    assert told == 100.083
    await client.send({"type": "playback.ack", "played_ms": told})
    acked = await client.recv_until(TURN_EVENT)
    assert "output_audio_buffer.stopped" in types_of(acked)
    assert acked[-1]["event"] == "idle"


async def test_text_input_becomes_transcript_and_answer(server):
    client, _ = await server.open()
    await client.send({"type": "input.text.append", "text": "hello there world"})
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    assert types_of(events[:5]) == COMMIT_FANOUT[:3] + [
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
    ]
    assert events[3]["transcript"] == "hello there world"
    deltas = [e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"]
    assert len(deltas) == 2 and "".join(deltas) == "hello there world"
    done = next(e for e in events if e["type"] == "response.output_audio_transcript.done")
    assert done["transcript"] == "hello there world"


async def test_text_modality_streams_text(server):
    client, _ = await server.open()
    await client.send({"type": "session.update", "session": {"modalities": ["text"]}})
    await client.expect("session.updated")
    await client.send({"type": "input.text.append", "text": "one two"})
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    open_ = [
        "response.created",
        "conversation.item.added",
        "conversation.item.created",
        "response.output_item.added",
        "response.content_part.added",
    ]
    text = ["response.output_text.delta", "response.text.delta"]
    assert types_of(events) == COMMIT_FANOUT + open_ + [TURN_EVENT] + text * 2 + TEXT_CLOSE
    assert events[len(COMMIT_FANOUT + open_)]["event"] == "assistant_generating"
    # no audio to play: the floor is free once the answer is done
    assert (await client.expect(TURN_EVENT))["event"] == "idle"


async def test_declared_silence_is_listen(server):
    client, _ = await server.open()
    await client.append(tone_pcm16(100, amp=0))
    await client.send({"type": "input_audio_buffer.commit", "is_speech": False})
    listen = await client.expect("response.listen")
    assert listen["reason"] == "client_declared_silence"
    quiet = await assert_quiet(client)
    assert types_of(quiet) == ["session.heartbeat_ack"]


async def test_deferred_commit_then_response_create(server):
    client, _ = await server.open()
    await client.append(tone_pcm16(100))
    await client.send({"type": "input_audio_buffer.commit", "response_create": False})
    fanout = await client.recv_until("conversation.item.done")
    assert types_of(fanout) == COMMIT_FANOUT
    assert fanout[0]["event"]["response_create_deferred"] is True
    assert (await client.expect(TURN_EVENT))["event"] == "user_committed"
    await client.send({"type": "response.create"})
    events = await client.recv_until("rate_limits.updated")
    assert types_of(events) == RESPONSE_OPEN + [TURN_EVENT] + answer_audio(1) + RESPONSE_CLOSE


async def test_response_create_without_input(server):
    client, _ = await server.open()
    await client.send({"type": "response.create", "event_id": "rc1"})
    error = await client.expect("error")
    assert error["error"]["code"] == "response_create_without_input"
    assert error["error"]["event_id"] == "rc1"


async def test_response_create_coalesces_with_auto_response(server):
    client = await slow_session(server, 10)
    await client.append(tone_pcm16(300))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    events = await client.recv_until("rate_limits.updated")
    assert types_of(events).count("response.created") == 1
    assert events[-2]["response"]["status"] == "completed"


async def test_response_create_with_overrides_supersedes(server):
    client = await slow_session(server)
    first = await start_long_response(client)
    await client.send({"type": "response.create", "response": {"instructions": "again"}})
    events = await client.recv_until("response.created")
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert done["id"] == first["id"]
    assert done["status"] == "cancelled"
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert done["duplex"]["reason"] == "new_response"
    second = events[-1]["response"]
    assert second["id"] != first["id"] and second["duplex"]["epoch"] == 1


async def test_response_cancel_fences_stale_output(server):
    client = await slow_session(server)
    response = await start_long_response(client)
    await client.send({"type": "response.cancel"})
    events = await client.recv_until("rate_limits.updated")
    tail = [t for t in types_of(events) if t not in AUDIO_CHUNK and t != TURN_EVENT]
    assert tail == RESPONSE_CLOSE
    done = events[-2]["response"]
    assert done["id"] == response["id"]
    assert done["status"] == "cancelled" and done["duplex"]["reason"] == "client_cancelled"
    assert done["output"][0]["status"] == "incomplete"
    quiet = await assert_quiet(client)
    assert types_of(quiet) == [TURN_EVENT, "session.heartbeat_ack"]
    assert quiet[0]["event"] == "idle" and quiet[1]["epoch"] == 1


async def test_cancel_without_response_is_an_error(server):
    client, _ = await server.open()
    await client.send({"type": "response.cancel", "event_id": "c1"})
    error = await client.expect("error")
    assert error["error"]["code"] == "response_cancel_not_active"  # OpenAI's code
    await client.send({"type": "response.cancel", "response_id": "resp_nope"})
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"]) == ("response_not_found", "response_id")


async def test_output_audio_buffer_clear(server):
    client = await slow_session(server)
    response = await start_long_response(client)
    await client.send({"type": "output_audio_buffer.clear"})
    events = await client.recv_until("output_audio_buffer.cleared")
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert done["duplex"]["reason"] == "output_cleared"
    assert events[-1]["response_id"] == response["id"] and events[-1]["epoch"] == 1
    quiet = await assert_quiet(client)
    assert [e.get("event") for e in quiet] == ["idle", None]  # the floor, then the ack


async def test_barge_in_both_spellings(server):
    client = await slow_session(server)
    for epoch, signal in enumerate(
        [{"type": "barge_in"}, {"type": "turn.signal", "event": "barge_in"}], start=1
    ):
        await start_long_response(client)
        await client.send(signal)
        events = await client.recv_until("output_audio_buffer.cleared")
        done = next(e for e in events if e["type"] == "response.done")["response"]
        assert done["status"] == "cancelled"
        assert done["duplex"]["reason"] == "barge_in"
        assert events[-1]["epoch"] == epoch
        quiet = await assert_quiet(client)
        assert types_of(quiet) == [TURN_EVENT, TURN_EVENT, "session.heartbeat_ack"]
        assert [e["event"] for e in quiet[:2]] == ["barge_in", "idle"]


async def test_input_cancel_and_clear(server):
    client, _ = await server.open()
    await client.append(tone_pcm16(100))
    await client.send({"type": "input_audio_buffer.clear"})
    assert (await client.expect("input_audio_buffer.cleared"))["epoch"] == 0
    await client.append(tone_pcm16(100))
    await client.send({"type": "input.cancel"})
    assert (await client.expect("input_audio_buffer.cleared"))["epoch"] == 1
    await client.send({"type": "input_audio_buffer.commit"})
    assert (await client.expect("error"))["error"]["code"] == "input_audio_buffer_empty"
    await client.append(tone_pcm16(100), epoch=0)
    stale = await client.expect("error")
    assert stale["error"]["code"] == "stale_epoch"


async def test_native_commit_spelling(server):
    client, _ = await server.open()
    await client.append(tone_pcm16(100))
    await client.send({"type": "input.commit"})
    events = await client.recv_until("rate_limits.updated")
    assert types_of(events) == full_turn(1)


async def test_commit_while_speaking_starts_a_new_response(server):
    client = await slow_session(server)
    first = await start_long_response(client)
    await client.append(tone_pcm16(100))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("response.created")
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert done["id"] == first["id"] and done["duplex"]["reason"] == "new_response"
    events = await client.recv_until("response.done")
    assert events[-1]["response"]["status"] == "completed"


async def test_a_failing_model_fails_the_response_not_the_session(server, monkeypatch):
    class Broken(KeyError):
        pass

    async def broken_stream(request):
        raise Broken("adapter bug")
        yield  # pragma: no cover - makes this an async generator

    monkeypatch.setattr(server.app.state.model, "stream", broken_stream)
    client, _ = await server.open()
    await client.append(tone_pcm16(100))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    error = next(e for e in events if e["type"] == "error")
    assert error["error"]["code"] == "engine_error" and "adapter bug" in error["error"]["message"]
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert (done["status"], done["duplex"]["reason"]) == ("failed", "engine_error")
    monkeypatch.undo()
    await client.append(tone_pcm16(100))
    await client.send({"type": "input_audio_buffer.commit"})
    assert (await client.recv_until("response.done"))[-1]["response"]["status"] == "completed"


async def test_an_actor_bug_closes_the_socket_loudly(server, monkeypatch, caplog):
    import websockets

    from duplex_server.sessions.core import pipeline
    from protocol import client_events as ce

    def buggy(batch, event, model):
        raise KeyError("handler bug")

    monkeypatch.setitem(pipeline.HANDLERS, ce.InputAudioClear, buggy)
    client, _ = await server.open()
    await client.send({"type": "input_audio_buffer.clear"})
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await client.recv(timeout=5)
    assert closed.value.rcvd.code == 1011
    assert "actor failed" in caplog.text and "handler bug" in caplog.text


async def test_a_session_whose_actor_failed_resumes_from_its_log(server, monkeypatch):
    """1011 ends the actor, not the session: on a durable store a resume
    rebuilds it from the log and the conversation goes on; on the memory
    store the session is gone and the resume says so."""
    import websockets

    from duplex_server.sessions.core import pipeline
    from protocol import client_events as ce

    def buggy(batch, event, model):
        raise KeyError("handler bug")

    client, created = await server.open()
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit"})
    turn = await client.recv_until("rate_limits.updated")
    monkeypatch.setitem(pipeline.HANDLERS, ce.InputAudioClear, buggy)
    await client.send({"type": "input_audio_buffer.clear"})
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await client.recv(timeout=5)
    assert closed.value.rcvd.code == 1011
    monkeypatch.undo()
    again = await WsClient.connect(server.ws_url + "&autostart=0")
    await again.send(
        {
            "type": "session.resume",
            "session_id": created["session"]["id"],
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": turn[-1]["server_event_seq"],
        }
    )
    answer = await again.recv()
    if server.config.store == "memory":
        assert answer["error"]["code"] == "session_resume_expired"
        return
    assert answer["type"] == "session.resumed"
    await again.append(tone_pcm16(200))
    await again.send({"type": "input_audio_buffer.commit"})
    events = await again.recv_until("rate_limits.updated")
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    assert committed["event"]["turn_id"] == 2


async def test_a_store_that_refuses_a_trim_does_not_end_the_session(server, monkeypatch):
    """Trimming acknowledged events only frees space, and the next trim covers
    it: a store that refuses one (a full disk) costs a warning, not the session."""
    from duplex_server.sessions.log.store import StorageUnavailable

    async def refuse(session_id, upto):
        raise StorageUnavailable("disk full")

    client, _ = await server.open()
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit"})
    turn = await client.recv_until("rate_limits.updated")
    monkeypatch.setattr(server.app.state.log, "trim", refuse)
    await client.send(
        {"type": "session.event_ack", "server_event_seq": turn[-1]["server_event_seq"]}
    )
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")
    monkeypatch.undo()
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    assert events[-2]["response"]["status"] == "completed"


async def test_a_refusal_the_store_cannot_record_still_names_the_event(server, monkeypatch):
    """A refused event is answered by an error journaled in its own batch; if
    the store refuses that batch too, the client is still told which event
    failed (else it could not know to re-send it)."""
    from duplex_server.sessions.log.store import StorageUnavailable

    client, _ = await server.open()
    log = server.app.state.log

    async def refuse(session_id, records, fence):
        raise StorageUnavailable("disk full")

    monkeypatch.setattr(log, "append", refuse)
    await client.send(
        {"type": "playback.ack", "response_id": "resp_none", "played_ms": 10, "event_id": "p1"}
    )
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["event_id"]) == ("storage_unavailable", "p1")
    monkeypatch.undo()
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")
