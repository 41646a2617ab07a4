"""kill -9 of a real server mid-response; restart on the same database; resume.

For each seed the crash lands somewhere else in the stream. After restart the
client resumes from the last event it processed and must see every missed
journaled event once, in order, ending the interrupted response as
``incomplete``/``server_restart``; its acknowledged input is all in the log;
the next turn is turn 2.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import urllib.request

import pytest
import websockets

from tests.e2e.serverproc import ServerProcess, run_cli
from tests.wsclient import WsClient, tone_pcm16


def log_lines(server: ServerProcess, session_id: str) -> list[dict]:
    url = f"{server.http_url}/v1/sessions/{session_id}/events"
    with urllib.request.urlopen(url, timeout=10) as response:
        return [json.loads(line) for line in response.read().splitlines()]


async def crash_and_resume(tmp_path, seed: int, durability: str) -> None:
    rng = random.Random(seed)
    db = f"sqlite:{tmp_path / f'crash-{seed}.db'}"
    first = ServerProcess(db, "--durability", durability).start()
    try:
        client = await WsClient.connect(first.ws_url)
        created = await client.expect("session.created")
        session_id, token = created["session"]["id"], created["resume_token"]
        await client.send(
            {
                "type": "session.update",
                "session": {"extra_body": {"chunk_delay_ms": rng.choice([5, 15, 30])}},
            }
        )
        sent_ids = [f"a{seed}-{i}" for i in range(rng.randint(3, 8))]
        for event_id in sent_ids:
            await client.append(tone_pcm16(100), event_id=event_id)
        await client.send({"type": "input_audio_buffer.commit", "event_id": f"c{seed}"})
        seen: list[dict] = []
        stop_after = rng.randint(1, 60)
        while len(seen) < stop_after:
            event = await client.recv()
            seen.append(event)
            if event["type"] == "rate_limits.updated":
                break
        first.kill9()
        # Frames that left before the crash are still in the client's buffer.
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                seen.append(await client.recv(timeout=5))
    finally:
        first.stop()
    cursor = max(e["server_event_seq"] or 0 for e in seen)

    second = ServerProcess(db, "--durability", durability, port=first.port).start()
    try:
        again = await WsClient.connect(second.ws_url + "&autostart=0")
        await again.send(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": token,
                "last_received_server_event_seq": cursor,
            }
        )
        resumed = await again.expect("session.resumed")
        assert resumed["replay_from_seq"] == cursor + 1
        replay = []
        for _ in range(resumed["replay_to_seq"] - cursor):
            replay.append(await again.recv())
        seqs = [e["server_event_seq"] for e in replay]
        assert seqs == list(range(cursor + 1, resumed["replay_to_seq"] + 1))  # no gap, no dup
        # The commit landed if its event is journaled, seen before the crash
        # or not (the crash may come between the append and the send).
        committed = any(e["type"] == "input_audio_buffer.committed" for e in seen + replay)
        done = [e for e in seen + replay if e["type"] == "response.done"]
        if committed:
            assert len(done) == 1
            status = done[0]["response"]["status"]
            details = done[0]["response"]["duplex"]
            assert status == "completed" or (status, details["reason"]) == (
                "incomplete",
                "server_restart",
            )
        # What the client saw before the crash is exactly what the log journaled.
        lines = log_lines(second, session_id)
        journal = {
            line["body"]["server_event_seq"]: line for line in lines if line["kind"] == "out"
        }
        for event in seen:
            if event["server_event_seq"] is not None:
                assert journal[event["server_event_seq"]]["body"]["event_type"] == event["type"]
        logged_ids = [line["event_id"] for line in lines if line["event_id"]]
        assert len(logged_ids) == len(set(logged_ids))
        if committed:
            assert set(sent_ids) <= set(logged_ids)
        # The client re-sends what it cannot know was applied: applied once.
        for event_id in sent_ids:
            await again.append(tone_pcm16(100), event_id=event_id)
        await again.append(tone_pcm16(100), event_id=f"after{seed}")
        await again.send({"type": "input_audio_buffer.commit"})
        turn = await again.recv_until("rate_limits.updated")
        committed_event = next(e for e in turn if e["type"] == "input_audio_buffer.committed")
        assert committed_event["event"]["turn_id"] == (2 if committed else 1)
        assert turn[-2]["response"]["status"] == "completed"
        # Each re-sent id that had landed is answered, not met with silence.
        answered = {
            e["error"]["event_id"]: e["error"]["code"] for e in turn if e["type"] == "error"
        }
        assert answered == dict.fromkeys(set(sent_ids) & set(logged_ids), "duplicate_event")
        if committed:  # the commit's id again, as a client that reuses it would send
            await again.send({"type": "input_audio_buffer.commit", "event_id": f"c{seed}"})
            error = (await again.expect("error"))["error"]
            assert (error["code"], error["event_id"]) == ("duplicate_event", f"c{seed}")
        lines = log_lines(second, session_id)
        ids = [line["event_id"] for line in lines if line["event_id"]]
        assert len(ids) == len(set(ids))
    finally:
        second.stop()


@pytest.mark.parametrize("seed", range(20))
async def test_kill9_mid_response_fsync_per_batch(tmp_path, seed):
    await crash_and_resume(tmp_path, seed, "fsync-per-batch")


@pytest.mark.parametrize("seed", range(100, 104))
async def test_kill9_mid_response_os_buffered(tmp_path, seed):
    """os-buffered acknowledges before fsync: a process crash loses nothing
    (the OS holds the data); only a power loss could lose the unsynced tail."""
    await crash_and_resume(tmp_path, seed, "os-buffered")


async def test_grace_lapsed_while_down_expires_on_start(tmp_path):
    db = f"sqlite:{tmp_path / 'grace.db'}"
    first = ServerProcess(db, "--disconnect-grace-s", "0.5").start()
    try:
        client = await WsClient.connect(first.ws_url)
        created = await client.expect("session.created")
        await client.send({"type": "session.heartbeat"})
        await client.expect("session.heartbeat_ack")
        first.kill9()
    finally:
        first.stop()
    await asyncio.sleep(1.0)
    second = ServerProcess(db, "--disconnect-grace-s", "0.5", port=first.port).start()
    try:
        session_id = created["session"]["id"]
        late = await WsClient.connect(second.ws_url + "&autostart=0")
        await late.send(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": created["resume_token"],
                "last_received_server_event_seq": 1,
            }
        )
        error = await late.expect("error")
        assert error["error"]["code"] == "session_resume_expired"
        lines = log_lines(second, session_id)
        assert lines[-1]["kind"] == "close"
        assert lines[-1]["body"]["reason"] == "disconnect_grace_expired"
        expired = [
            json.loads(base64.b64decode(line["body"]["payload"]))
            for line in lines
            if line["kind"] == "out"
        ][-1]
        assert expired["type"] == "session.expired"
    finally:
        second.stop()


@pytest.mark.parametrize("content", [b"this is not a database" * 100, b""])
def test_corrupt_database_is_refused_clearly(tmp_path, content):
    path = tmp_path / "broken.db"
    if content:
        path.write_bytes(content)
    else:  # a real database truncated mid-page
        import sqlite3

        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE records (x)")
        conn.executemany("INSERT INTO records VALUES (?)", [(b"x" * 500,)] * 200)
        conn.commit()
        conn.close()
        path.write_bytes(path.read_bytes()[:5000])
    result = run_cli(
        "duplex_server.cli", "serve", "--store", f"sqlite:{path}", "--port", "0", timeout_s=30
    )
    assert result.returncode != 0
    assert str(path) in result.stderr
    assert "Traceback" not in result.stderr
