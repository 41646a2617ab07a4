"""Nothing leaks: liveness for anyone, details and metrics for the key,
no key, token or store password in any log line, even at debug level."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request

import httpx
import pytest
import websockets

from duplex_bench.server_process import free_port
from duplex_server.redaction import REDACTED, redact

KEY = "k3y-" + "x" * 28


@pytest.mark.server_config(api_key=KEY)
async def test_health_tells_anonymous_callers_only_that_it_lives(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        anonymous = (await http.get("/health")).json()
        keyed = (await http.get("/health", headers={"Authorization": f"Bearer {KEY}"})).json()
        metrics_anonymous = await http.get("/metrics")
        metrics_keyed = await http.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert anonymous == {"status": "ok"}
    assert keyed["status"] == "ok" and keyed["model"] == "echo" and "store" in keyed
    assert metrics_anonymous.status_code == 401 and metrics_keyed.status_code == 200


async def test_a_log_cursor_beyond_64_bits_is_a_400(server):
    client, created = await server.open()
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        url = f"/v1/sessions/{created['session']['id']}/events"
        huge = await http.get(url, params={"after": 2**63})
        negative = await http.get(url, params={"after": -1})
    assert (huge.status_code, negative.status_code) == (400, 400)
    assert huge.json()["error"]["code"] == "invalid_request"


def test_redaction_covers_every_spelling_of_a_secret():
    lines = {
        "Authorization: Bearer abc.def": "Authorization: " + REDACTED,
        "('authorization', 'Bearer abc')": "('authorization', '" + REDACTED + "')",
        "subprotocols ['realtime', 'openai-insecure-api-key.s3cr3t']": (
            "subprotocols ['realtime', 'openai-insecure-api-key." + REDACTED + "']"
        ),
        '{"resume_token":"Zm9vYmFy_-1"}': '{"resume_token":"' + REDACTED + '"}',
        "redis://user:pa55@host:6379/0": "redis://user:" + REDACTED + "@host:6379/0",
        "rediss://:pa55@host/1": "rediss://:" + REDACTED + "@host/1",
    }
    for line, expected in lines.items():
        assert redact(line) == expected


def test_serve_refuses_an_empty_api_key():
    done = subprocess.run(
        [sys.executable, "-m", "duplex_server.cli", "serve", "--api-key", ""],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "API key" in done.stderr


async def test_no_secret_reaches_the_log_even_at_debug(tmp_path):
    port = free_port()
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "duplex_server.cli", "serve", "--port", str(port)]
            + ["--model", "echo", "--store", "memory", "--log-level", "debug", "--api-key", KEY],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_healthy(port)
            token = await _converse(port)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    text = log_path.read_text(errors="replace")
    assert "DEBUG" in text and "session.created" in text  # the dumps were logged...
    assert KEY not in text and token not in text  # ...without the secrets in them


async def _converse(port: int) -> str:
    """Open a session by header, resume it by subprotocol; return its last token."""
    url = f"ws://127.0.0.1:{port}/v1/realtime?duplex=1"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with websockets.connect(url, additional_headers=headers) as ws:
        created = json.loads(await ws.recv())
        session_id, token = created["session"]["id"], created["resume_token"]
    await asyncio.sleep(0.2)
    offer = ["realtime", f"openai-insecure-api-key.{KEY}"]
    async with websockets.connect(url + "&autostart=0", subprotocols=offer) as ws:
        resume = {"type": "session.resume", "session_id": session_id, "resume_token": token}
        resume["last_received_server_event_seq"] = 0
        await ws.send(json.dumps(resume))
        while (event := json.loads(await ws.recv()))["type"] != "session.resumed":
            pass
        token = event["resume_token"]
        await ws.send(json.dumps({"type": "session.close"}))
        while json.loads(await ws.recv())["type"] != "session.closed":
            pass
    return token


def _wait_healthy(port: int) -> None:
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the server did not come up")
