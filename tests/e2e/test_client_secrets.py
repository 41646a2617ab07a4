"""POST /v1/realtime/client_secrets: a short-lived key a browser uses once
to open one session, as the key that minted it, with the config it was
minted with."""

from __future__ import annotations

import json

import httpx
import pytest
import websockets

from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from tests.conftest import running_server
from tests.e2e.test_keys import bearer, keys_file
from tests.wsclient import WsClient


def offering(key: str) -> list[str]:
    return ["realtime", f"openai-insecure-api-key.{key}"]


async def test_a_client_secret_opens_one_session_as_its_minter(tmp_path):
    path, keys = keys_file(tmp_path, alice=(["realtime"], 0), ops=(["admin"], 0))
    config = ServerConfig(port=free_port(), model="echo", api_keys_file=path)
    async with running_server(config) as server:
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            minted = await http.post(
                "/v1/realtime/client_secrets",
                headers=bearer(keys["alice"]),
                json={
                    "expires_after": {"anchor": "created_at", "seconds": 60},
                    "session": {"instructions": "be brief", "voice": "alloy"},
                },
            )
            assert minted.status_code == 200, minted.text
            secret = minted.json()
            assert secret["value"].startswith("ek_") and secret["session"]["instructions"]
            # an admin-only key may not mint; a bad config is refused at minting
            no_scope = await http.post("/v1/realtime/client_secrets", headers=bearer(keys["ops"]))
            bad = await http.post(
                "/v1/realtime/client_secrets",
                headers=bearer(keys["alice"]),
                json={"session": {"output_sample_rate_hz": 96000}},
            )
            long = await http.post(
                "/v1/realtime/client_secrets",
                headers=bearer(keys["alice"]),
                json={"expires_after": {"seconds": 86400}},
            )
        assert no_scope.status_code == 403
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_audio"
        assert long.status_code == 400
        page = await WsClient.connect(server.ws_url, subprotocols=offering(secret["value"]))
        created = await page.expect("session.created")
        assert created["session"]["instructions"] == "be brief"
        assert server.app.state.manager.actors[created["session"]["id"]].state.owner == "alice"
        with pytest.raises(websockets.InvalidStatus) as again:  # used up
            await WsClient.connect(server.ws_url, subprotocols=offering(secret["value"]))
        assert again.value.response.status_code == 401


async def test_a_client_secret_expires_and_an_update_follows_its_config(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        soon = (await http.post("/v1/realtime/client_secrets", json={})).json()
        later = (
            await http.post(
                "/v1/realtime/client_secrets", json={"session": {"instructions": "from secret"}}
            )
        ).json()
    ephemeral = server.app.state.ephemeral
    real_clock = ephemeral._clock
    ephemeral._clock = lambda: real_clock() + 601  # past the default ten minutes
    with pytest.raises(websockets.InvalidStatus) as expired:
        await WsClient.connect(server.ws_url, subprotocols=offering(soon["value"]))
    assert expired.value.response.status_code == 401
    ephemeral._clock = real_clock
    client = await WsClient.connect(
        server.ws_url + "&autostart=0", subprotocols=offering(later["value"])
    )
    await client.send({"type": "session.update", "session": {"temperature": 0.6}})
    created = await client.expect("session.created")
    assert created["session"]["instructions"] == "from secret"
    updated = await client.recv_until("session.updated")
    assert updated[-1]["session"]["temperature"] == 0.6
    assert json.dumps(updated[-1]["session"]).count("from secret") == 1
