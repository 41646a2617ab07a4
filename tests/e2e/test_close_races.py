"""A close the store does not acknowledge must not end the actor with its
socket still open: the client would wait for a close that nobody sends, while
the server counts the session gone (the million-session Redis soak's two
churn sockets that outlived their sessions)."""

from __future__ import annotations

import asyncio

import pytest
import websockets

from duplex_bench.load_client import append_frame
from duplex_bench.soak import Churner, Tally
from duplex_server.sessions.log.store import StorageUnavailable
from tests.wsclient import WsClient

PATIENCE_S = 5.0  # far more than a close takes; a hung socket fails the test


def refuse_next_close(server, monkeypatch, *, landed: bool = False) -> None:
    """The store reports a failure for the next batch that closes a session,
    once; ``landed``: the batch is written first, as when a timeout loses the reply."""
    log = server.app.state.log
    append = log.append
    refused = False

    async def once(session_id, records, fence):
        nonlocal refused
        if refused or not any(r.kind == "close" for r in records):
            return await append(session_id, records, fence)
        refused = True
        if landed:
            await append(session_id, records, fence)
        raise StorageUnavailable("the store did not answer in time")

    monkeypatch.setattr(log, "append", once)


async def send_refused_close(client: WsClient) -> None:
    """``session.close``, which the client is told the store did not record."""
    await client.send({"type": "session.close", "event_id": "close-1"})
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["event_id"]) == ("storage_unavailable", "close-1")


async def assert_closes(client: WsClient, event_type: str, reason: str) -> None:
    """``event_type`` with ``reason`` comes next, then the server closes the socket."""
    event = await client.recv(timeout=PATIENCE_S)
    assert (event["type"], event["reason"]) == (event_type, reason)
    with pytest.raises(websockets.ConnectionClosedOK):
        await client.recv(timeout=PATIENCE_S)


async def test_a_close_the_store_refuses_leaves_the_session_serving(server, monkeypatch):
    """Nothing of a refused close applies: the client is told, the session is
    still live (its socket is open), and the client's retry closes it."""
    client, created = await server.open()
    refuse_next_close(server, monkeypatch)
    await send_refused_close(client)
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")
    assert created["session"]["id"] in server.manager.actors
    await client.send({"type": "session.close", "event_id": "close-1"})
    await assert_closes(client, "session.closed", "client_close")


async def test_a_close_that_landed_without_its_reply_closes_the_socket(server, monkeypatch):
    """The close is in the log though its append failed: the next message
    heals the actor from the log, which says closed, so the socket closes
    (after the session.closed the log journaled) and nothing more is applied."""
    client, _ = await server.open()
    refuse_next_close(server, monkeypatch, landed=True)
    await send_refused_close(client)
    await client.send({"type": "session.close", "event_id": "close-1"})
    await assert_closes(client, "session.closed", "client_close")  # once: the retry applied nothing


@pytest.mark.server_config(idle_ttl_s=0.5, reap_interval_s=0.05)
async def test_an_expiry_the_store_refuses_is_asked_again(server, monkeypatch):
    """The reaper's end is not recorded: the actor keeps serving and the
    reaper asks again, so the socket is closed, not left open to nobody."""
    client, _ = await server.open()
    refuse_next_close(server, monkeypatch)
    error = await client.expect("error")
    assert error["error"]["code"] == "storage_unavailable"
    await assert_closes(client, "session.expired", "idle_ttl_expired")


async def test_the_soak_churner_counts_a_refused_close_as_failed(server, monkeypatch):
    """The bench's churn client is told its close was not applied: it gives
    the session up at once instead of waiting out its patience for a close."""
    refuse_next_close(server, monkeypatch)
    tally, stop = Tally(), asyncio.Event()
    churner = Churner(f"ws://{server.base}/v1/realtime?duplex=1", [append_frame(100)], tally)
    running = asyncio.create_task(churner.run(stop))
    try:
        async with asyncio.timeout(PATIENCE_S):
            while not tally.failed:
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(running, PATIENCE_S)  # cancelled if still waiting
    assert tally.served <= 1  # the one that ended while it was told to stop


async def test_a_redis_stall_past_the_retry_window_does_not_strand_the_socket(server):
    """The soak's trigger, unfaked: Redis holds writes longer than the store
    waits (``--store-retry-ms``), so the close's append fails though Redis may
    still run it. The client is told; its retry closes the session either way."""
    if not server.app.state.log.shared:
        pytest.skip("a Redis stall")
    import redis.asyncio as aioredis

    client, _ = await server.open()
    stall_s = server.config.store_retry_ms / 1000 + 0.5
    admin = aioredis.from_url(server.config.store)
    try:
        await admin.execute_command("CLIENT", "PAUSE", int(stall_s * 1000), "WRITE")
        await send_refused_close(client)
        await asyncio.sleep(stall_s)  # until Redis takes writes again
    finally:
        await admin.aclose()
    await client.send({"type": "session.close", "event_id": "close-1"})
    await assert_closes(client, "session.closed", "client_close")
