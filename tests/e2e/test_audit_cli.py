"""duplex-server inspect / replay on a store written by a real server."""

from __future__ import annotations

import json
import subprocess

from tests.e2e.serverproc import ServerProcess, run_cli
from tests.wsclient import WsClient, tone_pcm16


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli("duplex_server.cli", *args)


async def test_inspect_and_replay(tmp_path):
    db = tmp_path / "audit.db"
    server = ServerProcess(f"sqlite:{db}").start()
    try:
        client = await WsClient.connect(server.ws_url)
        session_id = (await client.expect("session.created"))["session"]["id"]
        await client.append(tone_pcm16(200), event_id="mine-1")
        await client.send({"type": "input_audio_buffer.commit"})
        await client.recv_until("rate_limits.updated")
        await client.send({"type": "playback.ack", "played_ms": 150})
        (await client.recv_until("playback.acknowledged"))[-1]
        await client.close()
    finally:
        server.stop()
    listing = cli("inspect", str(db))
    assert listing.returncode == 0 and session_id in listing.stdout
    log = cli("inspect", str(db), session_id)
    assert log.returncode == 0
    assert "200.0 ms pcm16@24000 [mine-1]" in log.stdout
    assert "decision speak" in log.stdout and "response.done" in log.stdout
    assert "playback played=150" in log.stdout
    replay = cli("replay", str(db), session_id)
    state = json.loads(replay.stdout)
    assert state["turn_id"] == 1 and state["session_id"] == session_id
    assert state["last_response"]["playback"]["played_ms"] == 150.0
    assert state["lease"]["attached"] is False  # suspended by the clean stop
    missing = cli("inspect", str(db), "sess_missing")
    assert missing.returncode != 0 and "no session sess_missing" in missing.stderr
    absent = cli("replay", str(tmp_path / "absent.db"), "x")
    assert absent.returncode != 0 and "no such session database" in absent.stderr


async def test_inspect_escapes_what_a_client_wrote_and_reads_any_path(tmp_path):
    folder = tmp_path / "logs#1?"
    folder.mkdir()
    db = folder / "audit.db"
    server = ServerProcess(f"sqlite:{db}").start()
    try:
        client = await WsClient.connect(server.ws_url)
        session_id = (await client.expect("session.created"))["session"]["id"]
        await client.append(tone_pcm16(100), event_id="\x1b[2J\x1b]0;owned\x07\rfake")
        await client.send({"type": "session.heartbeat"})
        await client.recv_until("session.heartbeat_ack")
        await client.close()
    finally:
        server.stop()
    log = cli("inspect", str(db), session_id)
    assert log.returncode == 0, log.stderr
    assert "\x1b" not in log.stdout and "\r" not in log.stdout and "\x07" not in log.stdout
    assert "[\\x1b[2J\\x1b]0;owned\\x07\\rfake]" in log.stdout
