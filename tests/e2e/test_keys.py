"""Keys and tenants: named keys from a file (only hashes at rest), scopes,
session quotas, and sessions that belong to the key that opened them."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import httpx
import pytest
import websockets

from duplex_bench.server_process import free_port
from duplex_server.auth import new_key_entry
from duplex_server.config import ServerConfig
from tests.conftest import running_server
from tests.wsclient import WsClient


def keys_file(tmp_path, **people: tuple[list[str], int]) -> tuple[str, dict[str, str]]:
    path, keys = tmp_path / "keys.jsonl", {}
    lines = []
    for name, (scopes, quota) in people.items():
        keys[name], line = new_key_entry(name, scopes, quota)
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    return str(path), keys


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keys_add_prints_the_key_once_and_stores_only_its_hash(tmp_path):
    path = tmp_path / "keys.jsonl"
    command = [sys.executable, "-m", "duplex_server.cli", "keys", "add", str(path), "alice"]
    done = subprocess.run(
        [*command, "--scopes", "realtime,admin", "--max-sessions", "3"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    key = done.stdout.strip()
    entry = json.loads(path.read_text())
    assert key.startswith("dsk_") and key not in path.read_text()
    assert (entry["name"], entry["scopes"], entry["max_sessions"]) == (
        "alice",
        ["admin", "realtime"],
        3,
    )
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    bad = subprocess.run([*command, "--scopes", "root"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown scopes" in bad.stderr


async def test_sessions_belong_to_the_key_that_opened_them(tmp_path):
    path, keys = keys_file(
        tmp_path,
        alice=(["realtime"], 2),
        bob=(["realtime"], 0),
        ops=(["admin"], 0),
        batcher=(["batch"], 0),
    )
    config = ServerConfig(port=free_port(), model="echo", api_keys_file=path)
    async with running_server(config) as server:
        mine = await WsClient.connect(server.ws_url, additional_headers=bearer(keys["alice"]))
        created = await mine.expect("session.created")
        session_id, token = created["session"]["id"], created["resume_token"]
        # another key cannot take it, even holding its resume token
        thief = await WsClient.connect(
            server.ws_url + "&autostart=0", additional_headers=bearer(keys["bob"])
        )
        resume = {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": token,
            "last_received_server_event_seq": 0,
        }
        await thief.send(resume)
        refused = await thief.expect("error")
        assert (refused["error"]["code"], refused["error"]["type"]) == (
            "forbidden",
            "authentication_error",
        )
        await mine.send({"type": "session.heartbeat"})
        await mine.recv_until("session.heartbeat_ack")  # undisturbed
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            events = f"/v1/sessions/{session_id}/events"
            assert (await http.get(events, headers=bearer(keys["bob"]))).status_code == 403
            assert (await http.get(events, headers=bearer(keys["alice"]))).status_code == 200
            assert (await http.get(events, headers=bearer(keys["ops"]))).status_code == 200
            detail = f"/v1/sessions/{session_id}"
            assert (await http.get(detail, headers=bearer(keys["bob"]))).status_code == 403
            assert (await http.get("/metrics", headers=bearer(keys["alice"]))).status_code == 403
            assert (await http.get("/metrics", headers=bearer(keys["ops"]))).status_code == 200
        # a quota of two live sessions
        await WsClient.connect(server.ws_url, additional_headers=bearer(keys["alice"]))
        with pytest.raises(websockets.InvalidStatus) as over_quota:
            await WsClient.connect(server.ws_url, additional_headers=bearer(keys["alice"]))
        answer = over_quota.value.response  # answered before the upgrade, with when to retry
        assert answer.status_code == 429 and "Retry-After" in answer.headers
        assert json.loads(answer.body)["error"]["code"] == "resource_exhausted"
        # scopes, and keys the server does not know
        for key, status in ((keys["batcher"], 403), ("dsk_" + "0" * 43, 401)):
            with pytest.raises(websockets.InvalidStatus) as denied:
                await WsClient.connect(server.ws_url, additional_headers=bearer(key))
            assert denied.value.response.status_code == status
        # the owner resumes as before
        await mine.close()
        back = await WsClient.connect(
            server.ws_url + "&autostart=0", additional_headers=bearer(keys["alice"])
        )
        await back.send(resume)
        await back.recv_until("session.resumed")


def test_one_kind_of_key_at_a_time(tmp_path):
    path, _ = keys_file(tmp_path, alice=(["realtime"], 0))
    done = subprocess.run(
        [sys.executable, "-m", "duplex_server.cli", "serve", "--port", str(free_port())]
        + ["--api-key", "k" * 20, "--api-keys-file", path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "choose one" in done.stderr
