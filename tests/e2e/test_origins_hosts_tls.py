"""Who may talk to the server: browser Origins, Host names, and TLS."""

from __future__ import annotations

import json
import ssl

import httpx
import pytest
import trustme
import websockets

from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from tests.conftest import running_server

APP = "https://app.example"


@pytest.mark.server_config(allowed_origins=[APP])
async def test_only_allowed_pages_open_websockets(server):
    with pytest.raises(websockets.InvalidStatus) as refused:
        await websockets.connect(server.ws_url, origin="https://evil.example")
    assert refused.value.response.status_code == 403
    error = json.loads(refused.value.response.body)["error"]
    assert error["code"] == "origin_not_allowed" and "evil.example" in error["message"]
    async with websockets.connect(server.ws_url, origin=APP) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
    async with websockets.connect(server.ws_url) as ws:  # not a browser: no Origin
        assert json.loads(await ws.recv())["type"] == "session.created"


@pytest.mark.server_config(allowed_hosts=["voice.example"])
async def test_only_allowed_host_names_are_served(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        wrong = await http.get("/health")
        right = await http.get("/health", headers={"Host": "voice.example"})
    assert (wrong.status_code, right.status_code) == (400, 200)


async def test_tls_serves_https_and_wss(tmp_path):
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    certificate.cert_chain_pems[0].write_to_path(cert)
    certificate.private_key_pem.write_to_path(key)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    config = ServerConfig(
        port=free_port(), model="echo", ssl_certfile=str(cert), ssl_keyfile=str(key)
    )
    async with running_server(config):
        async with httpx.AsyncClient(verify=trusting) as http:
            health = await http.get(f"https://127.0.0.1:{config.port}/health")
        assert health.json()["status"] == "ok"
        url = f"wss://127.0.0.1:{config.port}/v1/realtime?duplex=1"
        async with websockets.connect(url, ssl=trusting) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
        with pytest.raises((websockets.InvalidMessage, websockets.InvalidHandshake, OSError)):
            async with websockets.connect(url.replace("wss://", "ws://")) as ws:
                await ws.recv()
