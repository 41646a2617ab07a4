"""One client cannot hold the server's sockets: request heads have a
deadline, a client address holds a bounded number of connections and
WebSockets, and a socket that opens no session is closed."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from tests.wsclient import WsClient


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1024), timeout_s) == b""
    except TimeoutError:
        return False


@pytest.mark.server_config(header_timeout_s=0.5)
async def test_a_silent_or_half_sent_request_is_closed_at_the_header_deadline(server):
    silent_reader, silent = await asyncio.open_connection("127.0.0.1", server.config.port)
    half_reader, half = await asyncio.open_connection("127.0.0.1", server.config.port)
    half.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    await half.drain()
    assert await _closed_within(silent_reader, 10.0)
    assert await _closed_within(half_reader, 10.0)
    for writer in (silent, half):
        writer.close()
    bystander, _ = await server.open()  # the server serves on
    await bystander.send({"type": "session.heartbeat"})
    await bystander.expect("session.heartbeat_ack")


@pytest.mark.server_config(header_timeout_s=30.0, max_connections_per_ip=3)
async def test_an_address_holds_a_bounded_number_of_http_connections(server):
    held = [await asyncio.open_connection("127.0.0.1", server.config.port) for _ in range(3)]
    reader, writer = await asyncio.open_connection("127.0.0.1", server.config.port)
    # The fourth is answered at once, unread: 429 with Retry-After, then closed.
    answer = await asyncio.wait_for(reader.read(), 10.0)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429 ") and b"retry-after: 1" in head.lower()
    assert json.loads(body)["error"]["code"] == "rate_limited"
    writer.close()
    _, first = held.pop()
    first.close()
    await asyncio.sleep(0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.config.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    for _, other in [*held, (reader, writer)]:
        other.close()


@pytest.mark.server_config(max_connection_rate_per_ip=1.0)
async def test_an_address_past_its_connection_rate_is_told_when_to_come_back(server):
    async with httpx.AsyncClient() as http:
        # a fresh connection each time: the bucket holds 2 s of 1 a second
        answers = [
            await http.get(f"{server.http_url}/health", headers={"connection": "close"})
            for _ in range(4)
        ]
    refused = [answer for answer in answers if answer.status_code == 429]
    assert refused and all(int(answer.headers["retry-after"]) >= 1 for answer in refused)
    assert refused[0].json()["error"]["type"] == "rate_limit_error"
    assert answers[0].status_code == 200


@pytest.mark.server_config(max_connections_per_ip=2)
async def test_an_address_holds_a_bounded_number_of_websockets(server):
    first, _ = await server.open()
    second, _ = await server.open()
    with pytest.raises(websockets.InvalidStatus) as refused:
        await WsClient.connect(server.ws_url)
    answer = refused.value.response
    assert answer.status_code == 429 and answer.headers["Retry-After"] == "1"
    error = json.loads(answer.body)["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limited")
    await first.close()
    await asyncio.sleep(0.2)
    third, _ = await server.open()  # a slot came free
    await third.send({"type": "session.heartbeat"})
    await third.recv_until("session.heartbeat_ack")
    await second.send({"type": "session.heartbeat"})
    await second.recv_until("session.heartbeat_ack")


@pytest.mark.server_config(handshake_timeout_s=0.5)
async def test_a_socket_that_opens_no_session_is_closed(server):
    client = await WsClient.connect(server.ws_url + "&autostart=0")
    error = await client.expect("error")
    assert error["error"]["code"] == "config_timeout"
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await client.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


@pytest.mark.server_config(max_sessions_per_ip=2)
async def test_an_address_holds_a_bounded_number_of_sessions(server):
    """Closing the socket frees no slot (the session waits for its resume);
    closing the session does."""
    first, _ = await server.open()
    second, _ = await server.open()
    await second.close()  # detached, still resumable: it still counts
    with pytest.raises(websockets.InvalidStatus) as refused:
        await WsClient.connect(server.ws_url)
    answer = refused.value.response
    assert answer.status_code == 429 and answer.headers["Retry-After"] == "1"
    assert json.loads(answer.body)["error"]["code"] == "resource_exhausted"
    await first.send({"type": "session.close"})
    await first.recv_until("session.closed")
    await asyncio.sleep(0.2)
    fourth, _ = await server.open()
    await fourth.send({"type": "session.heartbeat"})
    await fourth.recv_until("session.heartbeat_ack")


@pytest.mark.server_config(api_key="k" * 20, max_sessions_per_key=1)
async def test_a_key_holds_a_bounded_number_of_sessions(server):
    headers = {"Authorization": "Bearer " + "k" * 20}
    first = await WsClient.connect(server.ws_url, additional_headers=headers)
    await first.expect("session.created")
    with pytest.raises(websockets.InvalidStatus) as refused:
        await WsClient.connect(server.ws_url, additional_headers=headers)
    answer = refused.value.response
    assert answer.status_code == 429 and answer.headers["Retry-After"] == "1"
    assert "quota of 1" in json.loads(answer.body)["error"]["message"]


async def test_a_closed_session_leaves_the_memory_store_at_once(server):
    """On the memory store nothing outlives the process, so a closed
    session's log is dropped at close (how it ended is still told); a
    durable store keeps it for the retention."""
    import httpx

    from duplex_server.sessions.log.store import UnknownSession
    from tests.wsclient import tone_pcm16

    client, created = await server.open()
    session_id = created["session"]["id"]
    await client.append(tone_pcm16(2000))
    await client.send({"type": "session.close"})
    await client.recv_until("session.closed")
    await asyncio.sleep(0.2)
    log = server.app.state.log
    if log.durable:
        assert await log.read(session_id)
    else:
        with pytest.raises(UnknownSession):
            await log.read(session_id)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        detail = (await http.get(f"/v1/sessions/{session_id}")).json()
    assert detail["state"] == "closed" and detail["reason"] == "client_close"
