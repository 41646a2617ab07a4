"""``duplex-server bench client``: what DuplexClient adds to event delivery.

Against one echo server (a subprocess), the same heartbeat round trips are
timed twice in one run: over a bare ``websockets`` connection (the baseline)
and through ``DuplexClient`` (send + ``wait_for``: its reader task, demux and
waiter). The difference is the library's cost per event.

Bench tooling may import the client library; the server never does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np
import websockets

from duplex_bench.server_process import ServerProcess

TARGET_EXTRA_P99_MS = 1.0


async def _raw(url: str, count: int) -> list[float]:
    async with websockets.connect(url, ping_interval=None) as ws:
        await ws.recv()  # session.created
        out = []
        for _ in range(count):
            started = time.perf_counter()
            await ws.send('{"type":"session.heartbeat"}')
            while '"session.heartbeat_ack"' not in await ws.recv():
                pass
            out.append(time.perf_counter() - started)
        return out


async def _client(url: str, count: int) -> list[float]:
    from clients.duplex import DuplexClient

    async with DuplexClient(url, heartbeat_interval_s=None) as client:
        out = []
        for _ in range(count):
            started = time.perf_counter()
            waiter = asyncio.ensure_future(client.wait_for("session.heartbeat_ack"))
            await asyncio.sleep(0)  # the waiter is listening before the send
            await client.send({"type": "session.heartbeat"})
            await waiter
            out.append(time.perf_counter() - started)
        return out


def _q(samples: list[float]) -> dict[str, float]:
    ms = np.array(samples) * 1000
    return {
        "p50": round(float(np.percentile(ms, 50)), 4),
        "p99": round(float(np.percentile(ms, 99)), 4),
    }


def run(args: argparse.Namespace) -> None:
    server = ServerProcess("memory")
    try:
        url = server.start().ws_at("/v1/duplex")
        raw, lib = [], []
        for _ in range(args.rounds):  # interleave to share the machine's noise
            raw += asyncio.run(_raw(url, args.count))
            lib += asyncio.run(_client(url, args.count))
    finally:
        server.stop()
    base, ours = _q(raw), _q(lib)
    extra = round(ours["p99"] - base["p99"], 4)
    print(
        json.dumps(
            {
                "bench": "client",
                "round_trips": len(raw),
                "raw_socket_ms": base,
                "duplex_client_ms": ours,
                "extra_p99_ms": extra,
                "p99_ratio": round(ours["p99"] / base["p99"], 3) if base["p99"] else None,
                "targets": {"extra_p99_at_most_1ms": extra <= TARGET_EXTRA_P99_MS},
            }
        )
    )
