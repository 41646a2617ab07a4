"""What a Redis store can give, measured in the run that uses it.

- ``raw_xadd``: ``redis-benchmark`` issuing plain pipelined ``XADD`` (the
  ceiling: no fencing, no sequence check, no bulk hash, no client logic);
- ``log_throughput``: our ``RedisLog.append`` at saturation from many
  concurrent sessions, each append one fenced, sequence-checked record, with
  the same payload size as the raw run;
- ``failover``: two replica processes; a client mid-response on one; that
  one is killed with SIGKILL; the time until the first replayed event
  arrives from the other.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from urllib.parse import urlparse

import numpy as np
import websockets

from duplex_bench.server_process import ServerProcess
from duplex_server.surface import AudioBody, Record, RedisLog, StorageUnavailable, connect_redis

PIPELINE = 16
CLIENTS = 50


def raw_xadd(url: str, payload_bytes: int, requests: int = 100_000) -> float | None:
    """Plain XADD per second from ``redis-benchmark`` (``-P 16``, 50 clients).

    Redis 7.0's redis-benchmark has no ``-t xadd``; the same command is given
    explicitly. None when redis-benchmark is not installed.
    """
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    where = urlparse(url)
    key = f"dxbench:raw:{uuid.uuid4().hex[:8]}"
    cmd = [
        binary,
        "-h", where.hostname or "127.0.0.1",
        "-p", str(where.port or 6379),
        "-n", str(requests),
        "-c", str(CLIENTS),
        "-P", str(PIPELINE),
        "--csv",
        "XADD", key, "*", "f", "x" * payload_bytes,
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    subprocess.run(
        [binary.replace("redis-benchmark", "redis-cli"), "-u", url, "DEL", key],
        capture_output=True,
        check=False,
    )
    last = out.strip().splitlines()[-1]
    return float(json.loads("[" + last + "]")[1])


def drop_prefix(url: str, prefix: str) -> int:
    """Delete every key a benchmark phase wrote under ``prefix``."""

    async def drop() -> int:
        client = connect_redis(url)
        try:
            keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
            for at in range(0, len(keys), 500):
                await client.unlink(*keys[at : at + 500])
            return len(keys)
        finally:
            await client.aclose()

    return asyncio.run(drop())


def _record(seq: int, pcm: bytes) -> Record:
    body = AudioBody(pcm=pcm, sample_rate_hz=24_000, source_format="pcm16", duration_ms=100.0)
    return Record(epoch=0, ts_ms=int(time.time() * 1000), origin="client", body=body, seq=seq)


async def _log_throughput(url: str, sessions: int, seconds: float, payload_bytes: int) -> dict:
    log = RedisLog(url, prefix=f"dxbench{uuid.uuid4().hex[:8]}")
    pcm = b"\x01" * payload_bytes
    latencies: list[float] = []
    count = 0
    ids = [f"bench{i}" for i in range(sessions)]
    for session_id in ids:
        await log.create(session_id)
    fences = {sid: await log.acquire_lease(sid, "bench") for sid in ids}
    deadline = time.perf_counter() + seconds

    async def writer(session_id: str) -> None:
        nonlocal count
        seq = 0
        while time.perf_counter() < deadline:
            seq += 1
            started = time.perf_counter()
            await log.append(session_id, [_record(seq, pcm)], fences[session_id])
            latencies.append(time.perf_counter() - started)
            count += 1

    started = time.perf_counter()
    await asyncio.gather(*(writer(sid) for sid in ids))
    elapsed = time.perf_counter() - started
    for session_id in ids:
        await log.delete(session_id)
    await log.close()
    values = np.array(latencies) * 1000
    return {
        "appends_per_s": round(count / elapsed, 1),
        "append_ms": {
            "p50": round(float(np.percentile(values, 50)), 3),
            "p99": round(float(np.percentile(values, 99)), 3),
        },
        "sessions": sessions,
    }


def log_throughput(url: str, sessions: int, seconds: float, payload_bytes: int) -> dict:
    return asyncio.run(_log_throughput(url, sessions, seconds, payload_bytes))


async def _one_failover(url: str, ttl_ms: int, ports: tuple[int, int]) -> float:
    prefix = f"dxfail{uuid.uuid4().hex[:8]}"

    def replica(port: int, name: str) -> ServerProcess:
        return ServerProcess(
            url, port=port, redis_prefix=prefix, replica_id=name, lease_ttl_ms=ttl_ms
        )

    owner, standby = replica(ports[0], "bench-a"), replica(ports[1], "bench-b")
    try:
        await asyncio.to_thread(owner.start)
        await asyncio.to_thread(standby.start)
        return await _kill_and_resume(owner, standby)
    finally:
        owner.stop()
        standby.stop()
        await asyncio.to_thread(drop_prefix, url, prefix)


async def _kill_and_resume(owner: ServerProcess, standby: ServerProcess) -> float:
    import base64

    pcm = (np.sin(np.arange(24_000) / 24_000 * 2 * np.pi * 440) * 6000).astype("<i2")
    async with websockets.connect(owner.ws_url) as ws:
        created = json.loads(await ws.recv())
        await ws.send(
            json.dumps(
                {"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 20}}}
            )
        )
        await ws.send(
            json.dumps(
                {
                    "type": "input_audio_buffer.append",
                    "audio": base64.b64encode(pcm.tobytes()).decode(),
                }
            )
        )
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        cursor = 0
        while True:  # mid-response: a few audio deltas in
            event = json.loads(await ws.recv())
            cursor = event.get("server_event_seq") or cursor
            if event["type"] == "response.output_audio.delta" and cursor > 12:
                break
        killed = time.perf_counter()
        owner.kill9()
    resume = {
        "type": "session.resume",
        "session_id": created["session"]["id"],
        "resume_token": created["resume_token"],
        "last_received_server_event_seq": cursor,
    }
    async with websockets.connect(standby.ws_at("/v1/realtime?autostart=0")) as ws:
        await ws.send(json.dumps(resume))
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "error":
                raise SystemExit(f"bench: resume failed: {event['error']}")
            if (event.get("server_event_seq") or 0) > cursor:
                return time.perf_counter() - killed


def failover(url: str, ttl_ms: int, rounds: int, ports: tuple[int, int]) -> dict:
    async def run() -> list[float]:
        return [await _one_failover(url, ttl_ms, ports) for _ in range(rounds)]

    try:
        times = asyncio.run(run())
    except StorageUnavailable as exc:
        raise SystemExit(f"bench: {exc}") from None
    return {
        "lease_ttl_ms": ttl_ms,
        "rounds": rounds,
        "kill_to_first_replayed_event_ms": {
            "min": round(min(times) * 1000, 1),
            "max": round(max(times) * 1000, 1),
        },
        "beyond_lease_ttl_ms_max": round(max(times) * 1000 - ttl_ms, 1),
    }
