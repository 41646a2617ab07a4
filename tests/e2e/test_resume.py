"""Resume on a new socket: exact replay, token rotation, replacement, gaps."""

from __future__ import annotations

import asyncio

import pytest
import websockets

from tests.e2e.sequences import RESPONSE_CLOSE
from tests.wsclient import WsClient, tone_pcm16, types_of


async def resume(server, session_id: str, token: str, cursor: int) -> WsClient:
    client = await server.connect("autostart=0")
    await client.send(
        {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": token,
            "last_received_server_event_seq": cursor,
        }
    )
    return client


def journaled(server, session_id: str) -> list[tuple[int, str]]:
    actor = server.manager.actors[session_id]
    return [(seq, payload) for seq, payload in actor.journal.since(0)]


async def test_drop_mid_response_resumes_with_exact_replay(server):
    client, created = await server.open()
    session_id, token = created["session"]["id"], created["resume_token"]
    await client.send({"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 20}}})
    await client.append(tone_pcm16(1000))
    await client.send({"type": "input_audio_buffer.commit"})
    seen = await client.recv_until("response.output_audio.delta")
    cursor = seen[-1]["server_event_seq"]
    await client.close()
    await asyncio.sleep(0.3)  # the response keeps streaming into the journal

    again = await resume(server, session_id, token, cursor)
    resumed = await again.expect("session.resumed")
    assert resumed["attachment_generation"] == 2
    assert resumed["resume_token"] != token
    assert resumed["replay_from_seq"] == cursor + 1
    assert resumed["server_event_seq"] is None
    events = await again.recv_until("rate_limits.updated")
    seqs = [e["server_event_seq"] for e in events]
    assert seqs == list(range(cursor + 1, cursor + 1 + len(seqs)))  # no gap, no duplicate
    assert types_of(events)[-len(RESPONSE_CLOSE) :] == RESPONSE_CLOSE
    # What was replayed is byte-for-byte what the journal holds.
    journal = dict(journaled(server, session_id))
    for event in events:
        assert journal[event["server_event_seq"]] == (
            __import__("json").dumps(event, separators=(",", ":")).encode()
        )
    # The conversation goes on: next turn is turn 2.
    await again.append(tone_pcm16(100))
    await again.send({"type": "input_audio_buffer.commit"})
    turn = await again.recv_until("rate_limits.updated")
    assert turn[0]["event"]["turn_id"] == 2  # input_audio_buffer.committed
    assert turn[-2]["response"]["status"] == "completed"


async def test_rotated_and_wrong_tokens_are_refused(server):
    client, created = await server.open()
    session_id, token = created["session"]["id"], created["resume_token"]
    await client.close()
    first = await resume(server, session_id, token, 0)
    new_token = (await first.expect("session.resumed"))["resume_token"]
    await first.close()
    await asyncio.sleep(0.05)
    for bad_token in (token, "x" * 22):
        attempt = await resume(server, session_id, bad_token, 0)
        error = await attempt.expect("error")
        assert error["error"]["code"] == "invalid_resume_token"
        assert error["error"]["param"] == "resume_token"
    other, other_created = await server.open()
    cross = await resume(server, other_created["session"]["id"], new_token, 0)
    assert (await cross.expect("error"))["error"]["code"] == "invalid_resume_token"
    unknown = await resume(server, "sess_nope", new_token, 0)
    error = await unknown.expect("error")
    assert (error["error"]["code"], error["error"]["param"]) == (
        "invalid_session_resume",
        "session_id",
    )
    # The session itself is untouched and still resumable with the current token.
    ok = await resume(server, session_id, new_token, 0)
    await ok.expect("session.resumed")


async def test_cursor_beyond_journal_is_refused(server):
    client, created = await server.open()
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")
    attempt = await resume(server, created["session"]["id"], created["resume_token"], 99)
    error = await attempt.expect("error")
    assert error["error"]["code"] == "invalid_session_resume"
    assert error["error"]["param"] == "last_received_server_event_seq"


async def test_resuming_the_session_a_socket_holds_is_a_conflict(server):
    """vLLM-Omni's client stops retrying on ``session_resume_conflict``: a
    socket asking for the session it already carries gets it, and keeps
    serving."""
    client, created = await server.open()
    await client.send(
        {
            "type": "session.resume",
            "session_id": created["session"]["id"],
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": 0,
        }
    )
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"]) == ("session_resume_conflict", "session_id")
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")


async def updated_seq(client: WsClient, n: int) -> int:
    """One journaled event (``session.updated``); its server_event_seq."""
    await client.send({"type": "session.update", "session": {"instructions": f"turn {n}"}})
    return (await client.expect("session.updated"))["server_event_seq"]


async def test_second_socket_replaces_the_first(server):
    client, created = await server.open()
    assert await updated_seq(client, 1) == 1
    newer = await resume(server, created["session"]["id"], created["resume_token"], 1)
    await newer.expect("session.resumed")
    replaced = await client.expect("session.replaced")
    assert replaced["attachment_generation"] == 2
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await client.recv(timeout=5)
    assert closed.value.rcvd.code == 4000
    assert await updated_seq(newer, 2) == 2


async def test_a_heartbeat_ack_answers_its_socket_only(server):
    """PROTOCOL.md: the ack is attachment-scoped, carries no seq and is never
    replayed, so a resumed client never takes an ack of a heartbeat sent on its
    old socket for one of its new socket's."""
    client, created = await server.open()
    await client.send({"type": "session.heartbeat"})
    ack = await client.expect("session.heartbeat_ack")
    assert ack["server_event_seq"] is None
    assert await updated_seq(client, 1) == 1  # the ack took no seq
    await client.close()
    await asyncio.sleep(0.05)
    again = await resume(server, created["session"]["id"], created["resume_token"], 0)
    resumed = await again.expect("session.resumed")
    assert resumed["replay_to_seq"] == 1
    assert (await again.recv())["type"] == "session.updated"  # the replay: no ack in it
    await again.send({"type": "session.heartbeat"})
    assert (await again.recv())["type"] == "session.heartbeat_ack"


async def test_trimmed_cursor_needs_resync(server):
    client, created = await server.open()
    for n in range(3):
        await updated_seq(client, n)
    await client.send({"type": "session.event_ack", "server_event_seq": 3})
    assert await updated_seq(client, 3) == 4
    await client.close()
    await asyncio.sleep(0.05)
    again = await resume(server, created["session"]["id"], created["resume_token"], 1)
    resumed = await again.expect("session.resumed")
    resync = await again.expect("session.resync_required")
    assert resync["reason"] == "journal_gap" and resync["oldest_available_seq"] == 4
    assert resync["session"]["id"] == created["session"]["id"]
    assert await updated_seq(again, 4) == 5
    assert resumed["replay_to_seq"] == 4


async def test_acked_events_are_trimmed_from_the_log(server):
    client, created = await server.open()
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    last = events[-1]["server_event_seq"]
    await client.send({"type": "session.event_ack", "server_event_seq": last})
    assert await updated_seq(client, 1) == last + 1  # after the ack: kept whole
    records = await server.app.state.log.read(created["session"]["id"])
    outs = [r.body for r in records if r.kind == "out"]
    assert all(o.trimmed and o.payload == b"" for o in outs if o.server_event_seq <= last)
    assert not outs[-1].trimmed
    await client.send({"type": "session.event_ack", "server_event_seq": 999, "event_id": "bad"})
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["param"]) == (
        "invalid_event",
        "server_event_seq",
    )


async def test_resume_on_an_autostarted_socket(server):
    client, created = await server.open()
    await client.close()
    other, other_created = await server.open()
    await other.send(
        {
            "type": "session.resume",
            "session_id": created["session"]["id"],
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": 0,
        }
    )
    await other.expect("session.resumed")
    await other.send({"type": "session.heartbeat"})
    await other.expect("session.heartbeat_ack")
    await asyncio.sleep(0.05)
    assert other_created["session"]["id"] not in server.manager.actors
    assert created["session"]["id"] in server.manager.actors


async def test_retried_event_id_applies_once_and_is_answered(server):
    """A retry (same id, same body) is not applied again and says so; the
    same id on a different event is refused; neither is met with silence."""
    client, created = await server.open()
    await client.append(tone_pcm16(100), event_id="a-1")
    await client.append(tone_pcm16(100), event_id="a-1")  # retry after a "drop"
    retry = await client.expect("error")
    assert retry["error"]["code"] == "duplicate_event"
    assert retry["error"]["event_id"] == "a-1" and retry["error"]["param"] == "event_id"
    await client.send(
        {"type": "input_audio_buffer.commit", "event_id": "c-1", "response_create": False}
    )
    events = await client.recv_until("conversation.item.done")
    assert events[0]["event"]["audio_ms"] == 100.0
    assert (await client.expect("turn.event"))["event"] == "user_committed"  # not answered yet
    landed = next(
        r.seq
        for r in await server.app.state.log.read(created["session"]["id"])
        if r.event_id == "c-1"
    )
    await client.send({"type": "input_audio_buffer.commit", "event_id": "c-1"})  # another body
    reused = await client.expect("error")
    assert reused["error"]["code"] == "event_id_reused"
    assert f"log seq {landed}" in reused["error"]["message"]
    await client.send({"type": "session.heartbeat"})
    after = await client.recv_until("session.heartbeat_ack")
    assert types_of(after) == ["session.heartbeat_ack"]
    records = await server.app.state.log.read(created["session"]["id"])
    assert [r.event_id for r in records if r.event_id] == ["a-1", "c-1"]


async def test_guessing_tokens_costs_the_socket(server, caplog):
    """Failed resumes are counted per socket, logged once, and the socket is
    closed at the fifth; the session guessed at is untouched."""
    import logging

    import websockets

    caplog.set_level(logging.WARNING, logger="duplex_server.realtime")
    client, created = await server.open()
    session_id, token = created["session"]["id"], created["resume_token"]
    guesser = await WsClient.connect(server.ws_url + "&autostart=0")
    for index in range(5):
        await guesser.send(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": f"guess-{index:017d}",
                "last_received_server_event_seq": 0,
            }
        )
        assert (await guesser.expect("error"))["error"]["code"] == "invalid_resume_token"
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await guesser.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    failed = [r for r in caplog.records if "failed resume of" in r.getMessage()]
    assert len(failed) == 1 and token not in failed[0].getMessage()
    await client.send({"type": "session.heartbeat"})
    await client.recv_until("session.heartbeat_ack")
