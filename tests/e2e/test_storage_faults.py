"""A full disk under a live server: clear errors, nothing half-applied, no crash."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest
import websockets

from tests.e2e.serverproc import ServerProcess
from tests.wsclient import WsClient, tone_pcm16

LIMIT = 2 * 1024 * 1024


async def fill_until_error(client: WsClient) -> tuple[dict, int]:
    """Append and heartbeat until the store refuses; the error and the last index."""
    chunk = tone_pcm16(100)
    for index in range(2 * LIMIT // len(chunk)):
        await client.append(chunk, event_id=f"a{index}")
        await client.send({"type": "session.heartbeat", "event_id": f"hb{index}"})
        event = (await client.recv_until("session.heartbeat_ack", "error"))[-1]
        if event["type"] == "error":
            return event, index
    raise AssertionError("the file size limit was never reached")


async def test_disk_full_gives_storage_unavailable_and_server_keeps_running(tmp_path):
    server = ServerProcess(f"sqlite:{tmp_path / 'full.db'}", max_file_bytes=LIMIT).start()
    try:
        client = await WsClient.connect(server.ws_url)
        await client.expect("session.created")
        error, index = await fill_until_error(client)
        assert error["error"]["type"] == "server_error"
        assert error["error"]["code"] == "storage_unavailable"
        assert "disk" in error["error"]["message"] and "full.db" in error["error"]["message"]
        # The failed append is named, so the client knows what to re-send.
        assert error["error"]["event_id"] in (f"a{index}", f"hb{index}")
        # The process is alive and says so; the session socket is still open.
        with urllib.request.urlopen(server.http_url + "/health", timeout=5) as response:
            assert json.load(response)["status"] == "ok"
        await client.send({"type": "session.heartbeat"})
        again = await client.recv_until("session.heartbeat_ack", "error")
        assert again[-1]["type"] in ("error", "session.heartbeat_ack")
        # A new session cannot be recorded either: told so, and asked to come back.
        newcomer = await WsClient.connect(server.ws_url)
        refused = await newcomer.expect("error")
        assert refused["error"]["code"] == "storage_unavailable"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await newcomer.recv(timeout=5)
        assert closed.value.rcvd.code == 1013
        assert server.proc.poll() is None
    finally:
        server.stop()


def _chattr(flag: str, *paths) -> None:
    subprocess.run(["chattr", flag, *map(str, paths)], check=True)


async def test_read_only_database_then_writable_again(tmp_path):
    """An immutable file (chattr +i: refused even to root, unlike chmod) makes
    appends fail clearly; once writable again the same session carries on."""
    db = tmp_path / "ro.db"
    server = ServerProcess(f"sqlite:{db}").start()
    files = [db, db.with_name("ro.db-wal")]
    try:
        client = await WsClient.connect(server.ws_url)
        await client.expect("session.created")
        await client.send({"type": "session.heartbeat"})
        await client.expect("session.heartbeat_ack")
        _chattr("+i", *files)
        try:
            await client.append(tone_pcm16(100), event_id="ro-1")
            error = await client.expect("error")
            assert error["error"]["code"] == "storage_unavailable"
            assert error["error"]["event_id"] == "ro-1"
            assert "ro.db" in error["error"]["message"]
        finally:
            _chattr("-i", *files)
        await client.append(tone_pcm16(100), event_id="ro-2")
        await client.send({"type": "input_audio_buffer.commit"})
        events = await client.recv_until("response.done")
        committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
        assert committed["event"]["audio_ms"] == 100.0  # ro-1 left nothing behind
        assert events[-1]["response"]["status"] == "completed"
    finally:
        server.stop()
