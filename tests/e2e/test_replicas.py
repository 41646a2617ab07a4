"""Several real server processes on one real Redis: failover, handoff,
partition and Redis restarts, end to end over WebSockets."""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request
import uuid

import pytest
import redis.asyncio as aioredis
import websockets

from duplex_bench.redis_process import RedisServer
from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from tests.conftest import running_server
from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_crash_recovery import log_lines
from tests.tcpproxy import PausableProxy
from tests.wsclient import WsClient, tone_pcm16

LEASE_TTL_MS = "1000"


def replica(store: str, prefix: str, name: str, *extra: str) -> ServerProcess:
    return ServerProcess(
        store,
        "--redis-prefix",
        prefix,
        "--replica-id",
        name,
        "--lease-ttl-ms",
        LEASE_TTL_MS,
        *extra,
    )


def health(server: ServerProcess) -> dict:
    with urllib.request.urlopen(server.http_url + "/health", timeout=5) as response:
        return json.load(response)


async def resume(
    server: ServerProcess, session_id: str, token: str, cursor: int
) -> tuple[WsClient, dict, list[dict]]:
    """Resume on ``server``; the resumed event and the replay that follows it."""
    client = await WsClient.connect(server.ws_url + "&autostart=0")
    await client.send(
        {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": token,
            "last_received_server_event_seq": cursor,
        }
    )
    resumed = await client.expect("session.resumed")
    replay = [await client.recv() for _ in range(resumed["replay_to_seq"] - cursor)]
    return client, resumed, replay


def leases(lines: list[dict]) -> list[tuple[str, str, int]]:
    return [
        (line["body"]["action"], line["body"]["owner"], line["body"]["fence"])
        for line in lines
        if line["kind"] == "lease"
    ]


async def next_turn(client: WsClient) -> list[dict]:
    await client.append(tone_pcm16(100))
    await client.send({"type": "input_audio_buffer.commit"})
    return await client.recv_until("rate_limits.updated")


async def open_session(server: ServerProcess) -> tuple[WsClient, str, str]:
    client = await WsClient.connect(server.ws_url)
    created = await client.expect("session.created")
    return client, created["session"]["id"], created["resume_token"]


@pytest.mark.parametrize("seed", range(4))
async def test_kill9_owner_mid_response_client_resumes_on_the_other_replica(redis_server, seed):
    rng = random.Random(seed)
    prefix = f"r{uuid.uuid4().hex[:10]}"
    a = replica(redis_server.url, prefix, "replica-a").start()
    b = replica(redis_server.url, prefix, "replica-b").start()
    try:
        client, session_id, token = await open_session(a)
        await client.send(
            {"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 20}}}
        )
        for index in range(rng.randint(2, 6)):
            await client.append(tone_pcm16(100), event_id=f"s{seed}-{index}")
        await client.send({"type": "input_audio_buffer.commit"})
        seen = [await client.recv() for _ in range(rng.randint(4, 30))]
        a.kill9()
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                seen.append(await client.recv(timeout=5))
        cursor = max(e["server_event_seq"] or 0 for e in seen)

        again, resumed, replay = await resume(b, session_id, token, cursor)
        seqs = [e["server_event_seq"] for e in replay]
        assert seqs == list(range(cursor + 1, resumed["replay_to_seq"] + 1))  # no gap, no dup
        done = [e for e in seen + replay if e["type"] == "response.done"]
        assert len(done) == 1
        response = done[0]["response"]
        assert response["status"] == "completed" or (
            response["status"],
            response["duplex"]["reason"],
        ) == ("incomplete", "server_restart")

        turn = await next_turn(again)
        assert turn[-2]["response"]["status"] == "completed"
        committed = next(e for e in turn if e["type"] == "input_audio_buffer.committed")
        assert committed["event"]["turn_id"] == 2
        history = leases(log_lines(b, session_id))
        a_fence = max(fence for _, owner, fence in history if owner == "replica-a")
        assert ("takeover", "replica-b", a_fence + 1) in history
        assert all(owner == "replica-b" for _, owner, _ in history[history.index(
            ("takeover", "replica-b", a_fence + 1)
        ):])  # fmt: skip
    finally:
        a.stop()
        b.stop()


async def test_resume_on_another_live_replica_hands_the_session_over(redis_server):
    prefix = f"r{uuid.uuid4().hex[:10]}"
    a = replica(redis_server.url, prefix, "replica-a").start()
    b = replica(redis_server.url, prefix, "replica-b").start()
    try:
        on_a, session_id, token = await open_session(a)
        assert (await next_turn(on_a))[-2]["response"]["status"] == "completed"
        on_b, resumed, _ = await resume(b, session_id, token, 0)
        # The old socket hears it was replaced, and is closed.
        replaced = await on_a.recv_until("session.replaced")
        assert replaced[-1]["type"] == "session.replaced"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await on_a.recv(timeout=5)
        assert closed.value.rcvd.code == 4001
        assert (await next_turn(on_b))[-2]["response"]["status"] == "completed"
        # And back again: B hands it to A the same way.
        back, again, _ = await resume(
            a, session_id, resumed["resume_token"], resumed["replay_to_seq"]
        )
        await on_b.recv_until("session.replaced")
        turn = await next_turn(back)
        committed = next(e for e in turn if e["type"] == "input_audio_buffer.committed")
        assert committed["event"]["turn_id"] == 3
        owners = [owner for action, owner, _ in leases(log_lines(a, session_id))]
        assert owners[0] == "replica-a" and "replica-b" in owners and owners[-1] == "replica-a"
    finally:
        a.stop()
        b.stop()


async def test_wrong_token_on_another_replica_disturbs_nothing(redis_server):
    prefix = f"r{uuid.uuid4().hex[:10]}"
    a = replica(redis_server.url, prefix, "replica-a").start()
    b = replica(redis_server.url, prefix, "replica-b").start()
    try:
        on_a, session_id, _ = await open_session(a)
        intruder = await WsClient.connect(b.ws_url + "&autostart=0")
        await intruder.send(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": "not-the-token",
                "last_received_server_event_seq": 0,
            }
        )
        error = await intruder.expect("error")
        assert error["error"]["code"] == "invalid_resume_token"
        await asyncio.sleep(1.0)  # several renewal periods: A keeps the session
        assert (await next_turn(on_a))[-2]["response"]["status"] == "completed"
    finally:
        a.stop()
        b.stop()


async def _stale_refusals(client: aioredis.Redis) -> int:
    stats = await client.info("errorstats")
    return int(stats.get("errorstat_STALE", {}).get("count", 0))


async def test_partitioned_owner_cannot_write_once_another_replica_holds_the_lease(
    redis_server,
):
    prefix = f"r{uuid.uuid4().hex[:10]}"
    proxy = await PausableProxy(redis_server.port).start()
    # Started off the event loop, which forwards A's traffic through the proxy.
    a = await asyncio.to_thread(
        replica(proxy.url, prefix, "replica-a", "--store-retry-ms", "300").start
    )
    b = replica(redis_server.url, prefix, "replica-b").start()
    direct = aioredis.from_url(redis_server.url)
    try:
        on_a, session_id, token = await open_session(a)
        await on_a.send({"type": "session.heartbeat"})
        await on_a.expect("session.heartbeat_ack")
        stream = f"{prefix}:{{{session_id}}}:log"
        before = await direct.xrange(stream)
        a_fence = before[-1][1][b"f"]
        refusals = await _stale_refusals(direct)

        proxy.pause()  # A can no longer reach Redis; B can
        await on_a.append(tone_pcm16(100), event_id="written-in-the-partition")
        error = await on_a.expect("error")
        assert error["error"]["code"] == "storage_unavailable"
        assert error["error"]["event_id"] == "written-in-the-partition"

        on_b, resumed, _ = await resume(b, session_id, token, 0)  # after A's lease lapsed
        await on_b.send({"type": "session.heartbeat"})
        await on_b.expect("session.heartbeat_ack")

        proxy.resume()  # A's delayed write now reaches Redis, and is refused
        replaced = await on_a.recv_until("session.replaced")
        assert replaced[-1]["type"] == "session.replaced"
        for _ in range(100):
            if await _stale_refusals(direct) > refusals:
                break
            await asyncio.sleep(0.05)
        assert await _stale_refusals(direct) > refusals

        after = await direct.xrange(stream)
        assert after[: len(before)] == before
        assert all(fields[b"f"] != a_fence for _, fields in after[len(before) :])
        lines = log_lines(b, session_id)
        assert "written-in-the-partition" not in [line["event_id"] for line in lines]
        turn = await next_turn(on_b)
        assert turn[-2]["response"]["status"] == "completed"
    finally:
        await direct.aclose()
        proxy.resume()
        await asyncio.to_thread(a.stop)
        b.stop()
        await proxy.close()


async def test_redis_restart_during_traffic(tmp_path):
    redis = RedisServer(tmp_path / "redis").start()
    server = ServerProcess(redis.url, "--store-retry-ms", "300").start()
    try:
        client, session_id, _ = await open_session(server)
        await client.send(
            {"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 30}}}
        )
        await client.append(tone_pcm16(2000))
        await client.send({"type": "input_audio_buffer.commit"})
        await client.recv_until("response.output_audio.delta")

        redis.stop()  # mid-response
        assert health(server)["status"] == "degraded"
        await client.append(tone_pcm16(100), event_id="during-outage")
        # Wait for this append's own refusal: an earlier error (the streaming
        # answer's) must not let Redis come back while it is still queued.
        outage = await client.recv_until("error")
        while outage[-1]["error"].get("event_id") != "during-outage":
            outage = await client.recv_until("error")
        assert outage[-1]["error"]["code"] == "storage_unavailable"
        newcomer = await WsClient.connect(server.ws_url)
        refused = await newcomer.expect("error")
        assert refused["error"]["code"] == "storage_unavailable"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await newcomer.recv(timeout=5)
        assert closed.value.rcvd.code == 1013

        redis.start()  # same port, same AOF: the log is back
        assert health(server)["status"] == "ok"
        await client.send({"type": "session.heartbeat"})
        after = await client.recv_until("session.heartbeat_ack")
        # The response the outage interrupted ends, as failed, before anything else.
        done = [e for e in after if e["type"] == "response.done"]
        assert [d["response"]["duplex"]["reason"] for d in done] == ["storage_unavailable"]
        turn = await next_turn(client)
        assert turn[-2]["response"]["status"] == "completed"
        lines = log_lines(server, session_id)
        assert "during-outage" not in [line["event_id"] for line in lines]
        seqs = [line["body"]["server_event_seq"] for line in lines if line["kind"] == "out"]
        assert seqs == list(range(1, len(seqs) + 1))
    finally:
        server.stop()
        redis.stop()


async def test_duplex_client_resumes_on_another_replica_by_itself(redis_server):
    from clients.duplex import ConnectionResumed, DuplexClient, ReconnectPolicy, presets
    from protocol import server_events as se

    prefix = f"r{uuid.uuid4().hex[:10]}"
    a = replica(redis_server.url, prefix, "replica-a").start()
    b = replica(redis_server.url, prefix, "replica-b").start()
    policy = ReconnectPolicy(max_attempts=12, initial_backoff_s=0.05, max_backoff_s=0.3)
    try:
        async with DuplexClient(
            a.ws_url,
            config=presets.echo(chunk_delay_ms=30),
            replicas=[b.ws_url],
            reconnect=policy,
            timeout_s=10,
        ) as client:
            await client.append_audio(tone_pcm16(2000))
            await client.commit()
            seqs: list[int] = []
            resumed = False
            async for event in client.events(timeout_s=15):
                seq = getattr(event, "server_event_seq", None)
                if seq is not None:
                    seqs.append(seq)
                if isinstance(event, se.OutputAudioDelta) and a.proc.poll() is None:
                    a.kill9()  # the client's replica dies mid-answer
                resumed = resumed or isinstance(event, ConnectionResumed)
                if isinstance(event, se.ResponseDone):
                    break
            assert resumed and client.url == b.ws_url
            # In order, none twice (the client shows one spelling of each event).
            assert seqs == sorted(set(seqs))
            assert event.response.status == "completed" or (
                event.response.duplex.reason == "server_restart"
            )
            await client.append_audio(tone_pcm16(300))
            committed = await client.commit()
            assert committed.event.turn_id == 2  # the conversation goes on, on B
    finally:
        a.stop()
        b.stop()


@pytest.fixture
async def lone_replica(redis_server):
    """One replica in this event loop, with renewals far apart so that only
    the renewals a test runs itself fall where it puts them."""
    config = ServerConfig(
        port=free_port(),
        store=redis_server.url,
        redis_prefix=f"r{uuid.uuid4().hex[:10]}",
        model="echo",
        lease_ttl_ms=600_000,
    )
    async with running_server(config) as running:
        yield running


async def test_a_renewal_while_a_session_opens_keeps_it(lone_replica):
    """A renewal can fall while a new session's log is still being created
    (its actor is registered, its fence still 0): that is not a lost lease."""
    manager, log = lone_replica.manager, lone_replica.app.state.log
    create = log.create

    async def create_after_a_renewal(session_id: str) -> None:
        await manager.renew_leases()
        await create(session_id)

    log.create = create_after_a_renewal
    client, _ = await lone_replica.open()
    await manager.renew_leases()
    assert (await next_turn(client))[-2]["response"]["status"] == "completed"


async def test_a_renewal_overtaken_by_a_resume_here_keeps_the_session(lone_replica):
    """A renewal asks about the fence it read; if the socket detaches (the
    lease is let go) and resumes here (taken back, a newer fence) before the
    store answers, the store calls the old fence lost, but the session is
    still this replica's."""
    manager, log = lone_replica.manager, lone_replica.app.state.log
    client, created = await lone_replica.open()
    session_id, token = created["session"]["id"], created["resume_token"]
    actor = manager.actors[session_id]
    old_fence = actor.lease.fence
    renew = log.renew_leases
    resumed: list[WsClient] = []

    async def renew_after_a_resume(owner: str, leases: dict[str, int]) -> dict:
        await client.close()
        while actor.lifecycle.holds_lease:
            await asyncio.sleep(0.01)
        again = await lone_replica.connect("autostart=0")
        await again.send(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": token,
                "last_received_server_event_seq": 0,
            }
        )
        await again.expect("session.resumed")
        resumed.append(again)
        return await renew(owner, leases)

    log.renew_leases = renew_after_a_resume
    await manager.renew_leases()
    log.renew_leases = renew
    assert actor.lease.fence > old_fence and manager.actors[session_id] is actor
    assert (await next_turn(resumed[0]))[-2]["response"]["status"] == "completed"
