"""``duplex-server bench sessions``: N clients streaming audio at one server.

Each client appends ``chunk_ms`` of audio every ``chunk_ms``, commits every
``commit_every_s``, acks the journal, and sends a heartbeat every second.
The same clients first run against a bare echo server (the baseline,
measured in the same run), then against duplex-server with the echo model.
One JSON line is printed; ratios compare the two phases.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import urllib.request
import uuid
from dataclasses import dataclass, field

import numpy as np
import psutil
import websockets

from duplex_server.bench.echo_server import EchoServerProcess
from duplex_server.bench.generator import GeneratorCpu, validity
from duplex_server.bench.server_process import ServerProcess, free_port
from duplex_server.metrics import histogram_quantile, parse_histogram
from duplex_server.sessions.log.redis_store import REDIS_SCHEMES

TARGET_COMMIT_TO_AUDIO_P99_MS = 50.0
TARGET_HEARTBEAT_RATIO = 1.5
TARGET_DURABLE_APPEND_P99_MS = 30.0
RENEW_TIMEOUT_S = 10.0  # for the server to close a session the client closed
AUDIO_RECORD_BYTES = 4800  # 100 ms of 24 kHz pcm16: what one append carries


def quantiles(samples: list[float]) -> dict[str, float | None]:
    if not samples:
        return {"p50": None, "p99": None}
    values = np.array(samples) * 1000.0
    return {
        "p50": round(float(np.percentile(values, 50)), 3),
        "p99": round(float(np.percentile(values, 99)), 3),
    }


@dataclass
class Measures:
    appends: int = 0
    heartbeat_rtt: list[float] = field(default_factory=list)
    commit_to_audio: list[float] = field(default_factory=list)
    errors: int = 0
    connect_failures: int = 0


def append_frame(chunk_ms: int) -> str:
    """The append every bench client sends: ``chunk_ms`` of a 24 kHz tone."""
    pcm = np.sin(np.arange(24 * chunk_ms) / 24000 * 2 * np.pi * 440) * 6000
    audio = base64.b64encode(pcm.astype("<i2").tobytes()).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio})


class BenchClient:
    """One session: a paced sender and a reader that timestamps what matters."""

    def __init__(
        self,
        url: str,
        frame: str,
        args: argparse.Namespace,
        measures: Measures,
        deadline: float,
        measure_from: float,
    ) -> None:
        self.url = url
        self.frame = frame
        self.args = args
        self.m = measures
        self.deadline = deadline
        self.measure_from = measure_from
        self.heartbeat_sent: float | None = None
        self.commit_sent: float | None = None
        self.last_seq = 0
        self._renewing = False

    def _measuring(self, now: float) -> bool:
        return now >= self.measure_from

    def renew(self) -> None:
        """Close this session at the next tick and go on in a fresh one: a
        bench that compares windows starts each from sessions of one age
        (a live session's log, and so the server's memory, grows as it talks)."""
        self._renewing = True

    async def run(self, start_delay: float) -> None:
        await asyncio.sleep(start_delay)
        while True:
            self._renewing = False
            self.heartbeat_sent = self.commit_sent = None
            self.last_seq = 0
            try:
                await self._session()
            except (OSError, websockets.WebSocketException):
                self.m.connect_failures += 1
                return
            if not self._renewing:
                return

    async def _session(self) -> None:
        async with websockets.connect(self.url, max_size=None, ping_interval=None) as ws:
            await ws.recv()  # session.created
            reader = asyncio.create_task(self._read(ws))
            await self._send(ws)
            if self._renewing:
                await ws.send('{"type":"session.close"}')
                await asyncio.wait({reader}, timeout=RENEW_TIMEOUT_S)  # the server closes
            reader.cancel()

    async def _send(self, ws) -> None:
        loop = asyncio.get_running_loop()
        period = self.args.chunk_ms / 1000.0
        per_commit = max(1, round(self.args.commit_every_s / period))
        per_heartbeat = max(1, round(1.0 / period))
        tick = 0
        next_at = loop.time()
        while (now := loop.time()) < self.deadline and not self._renewing:
            await ws.send(self.frame)
            if self._measuring(now):
                self.m.appends += 1
            tick += 1
            if tick % per_commit == 0:
                self.commit_sent = loop.time()
                await ws.send('{"type":"input_audio_buffer.commit"}')
                if self.last_seq:
                    await ws.send(
                        json.dumps({"type": "session.event_ack", "server_event_seq": self.last_seq})
                    )
            if tick % per_heartbeat == 0 and self.heartbeat_sent is None:
                self.heartbeat_sent = loop.time()
                await ws.send('{"type":"session.heartbeat"}')
            next_at += period
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def _read(self, ws) -> None:
        loop = asyncio.get_running_loop()
        async for frame in ws:
            now = loop.time()
            # Server frames start with their type (msgspec writes the tag first),
            # so the reader avoids parsing every audio delta.
            head = frame[:48]
            if '"session.heartbeat_ack"' in head and self.heartbeat_sent is not None:
                if self._measuring(now):
                    self.m.heartbeat_rtt.append(now - self.heartbeat_sent)
                self.heartbeat_sent = None
            elif '"response.output_audio.delta"' in head and self.commit_sent is not None:
                if self._measuring(now):
                    self.m.commit_to_audio.append(now - self.commit_sent)
                self.commit_sent = None
            elif '"rate_limits.updated"' in head:
                self.last_seq = json.loads(frame).get("server_event_seq") or self.last_seq
            elif '"error"' in head:
                self.m.errors += 1


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


async def _append_histograms(metrics_urls: list[str] | None) -> list[tuple[float, int]] | None:
    """The append-latency histogram summed over servers, or None when an
    overloaded server cannot answer."""
    if metrics_urls is None:
        return None
    total: list[tuple[float, int]] | None = None
    for url in metrics_urls:
        try:
            text = await asyncio.to_thread(_scrape, url)
        except (OSError, TimeoutError):
            return None
        buckets = parse_histogram(text, "duplex_append_latency_seconds")
        total = (
            buckets
            if total is None
            else [(b, n + m) for (b, n), (_, m) in zip(buckets, total, strict=True)]
        )
    return total


async def _drive(
    urls: list[str],
    args: argparse.Namespace,
    procs: list[psutil.Process],
    metrics_urls: list[str] | None,
) -> dict:
    """Sessions spread round-robin over ``urls`` (one per server process)."""
    frame = append_frame(args.chunk_ms)
    measures = Measures()
    loop = asyncio.get_running_loop()
    measure_from = loop.time() + args.ramp_s + 1.0
    deadline = measure_from + args.seconds
    clients = [
        BenchClient(urls[i % len(urls)], frame, args, measures, deadline, measure_from)
        for i in range(args.sessions)
    ]
    tasks = [
        asyncio.create_task(c.run(args.ramp_s * i / max(1, args.sessions)))
        for i, c in enumerate(clients)
    ]
    await asyncio.sleep(measure_from - loop.time())
    generator = GeneratorCpu()
    generator.start()
    for proc in procs:
        proc.cpu_percent(None)
    before = await _append_histograms(metrics_urls)
    await asyncio.sleep(max(0.0, deadline - loop.time()))
    cpu = sum(proc.cpu_percent(None) for proc in procs)
    load = generator.report()
    rss = sum(proc.memory_info().rss for proc in procs) / 2**20
    after = await _append_histograms(metrics_urls)
    await asyncio.gather(*tasks)
    result = {
        "appends_per_s": round(measures.appends / args.seconds, 1),
        "heartbeat_rtt_ms": quantiles(measures.heartbeat_rtt),
        "commit_to_first_audio_ms": quantiles(measures.commit_to_audio),
        "server_cpu_percent": round(cpu, 1),
        "server_rss_mib": round(rss, 1),
        "errors": measures.errors,
        "connect_failures": measures.connect_failures,
        **load,
    }
    if before is not None and after is not None:
        window = [(b, a - c) for (b, a), (_, c) in zip(after, before, strict=True)]
        p50, p99 = (histogram_quantile(window, q) for q in (0.5, 0.99))
        result["append_to_journal_ms"] = {
            "p50": None if p50 is None else round(p50 * 1000, 3),
            "p99": None if p99 is None else round(p99 * 1000, 3),
        }
    elif metrics_urls is not None:
        result["append_to_journal_ms"] = {
            "p50": None,
            "p99": None,
            "note": "server too loaded to answer /metrics",
        }
    return result


def _phase(servers: list[ServerProcess], args: argparse.Namespace, metrics: bool) -> dict:
    """Start the servers, run the load against them, stop them."""
    try:
        for server in servers:
            server.start()
        urls = [server.ws_url for server in servers]
        metrics_urls = [server.http_url + "/metrics" for server in servers]
        watched = [psutil.Process(server.pid) for server in servers]
        return asyncio.run(_drive(urls, args, watched, metrics_urls if metrics else None))
    finally:
        for server in servers:
            server.stop()


def ratio(ours: dict, base: dict, key: str, q: str) -> float | None:
    """``ours[key][q] / base[key][q]``, None when either is missing."""
    a, b = ours[key][q], base[key][q]
    return None if a is None or not b else round(a / b, 3)


def _server_phase(args: argparse.Namespace, store: str, replicas: int = 1) -> dict:
    # Each Redis phase writes under its own prefix, dropped afterwards: a
    # phase must not recover the sessions the previous one suspended.
    isolate = (
        ["--redis-prefix", f"dxbench{uuid.uuid4().hex[:8]}"]
        if store.startswith(REDIS_SCHEMES)
        else []
    )
    servers = [
        ServerProcess(
            store,
            *isolate,
            port=args.port + index if args.port else None,
            max_sessions=args.sessions + 10,
            replica_id=f"bench-{index}",
        )
        for index in range(replicas)
    ]
    try:
        result = _phase(servers, args, metrics=True)
    finally:
        if isolate:
            from duplex_server.bench.redis_limits import drop_prefix

            drop_prefix(store, isolate[1])
    return {"replicas": replicas, **result}


def _redis_extras(args: argparse.Namespace, one: dict) -> dict:
    """Two replicas on the same Redis, the raw XADD ceiling and failover time."""
    from duplex_server.bench import redis_limits

    two = _server_phase(args, args.store, replicas=2)
    raw = redis_limits.raw_xadd(args.store, AUDIO_RECORD_BYTES)
    raw_tiny = redis_limits.raw_xadd(args.store, 8)
    log = redis_limits.log_throughput(args.store, 64, 5.0, AUDIO_RECORD_BYTES)
    fraction = round(log["appends_per_s"] / raw, 3) if raw else None
    failover = redis_limits.failover(
        args.store, args.lease_ttl_ms, args.failover_rounds, (free_port(), free_port())
    )
    return {
        "two_replicas": two,
        "appends_per_s_ratio_two_vs_one_replica": round(
            two["appends_per_s"] / one["appends_per_s"], 3
        )
        if one["appends_per_s"]
        else None,
        "raw_xadd_per_s": {"payload_4800_bytes": raw, "payload_8_bytes": raw_tiny},
        "redis_log_saturated": log,
        "redis_log_fraction_of_raw_xadd": fraction,
        "failover": failover,
        "targets": {
            "redis_log_at_least_half_of_raw_xadd": None if fraction is None else fraction >= 0.5,
            "failover_under_lease_ttl_plus_1s": failover["beyond_lease_ttl_ms_max"] < 1000.0,
        },
    }


def run(args: argparse.Namespace) -> None:
    baseline = _phase([EchoServerProcess()], args, metrics=False)
    ours = _server_phase(args, args.store)
    phases = [ours, baseline]
    extra: dict = {}
    if args.store.startswith(REDIS_SCHEMES):
        extra["redis"] = _redis_extras(args, ours)
        phases.append(extra["redis"]["two_replicas"])
    if args.store != "memory":
        # The same load on the memory store, measured in this run, prices durability.
        memory = _server_phase(args, "memory")
        phases.append(memory)
        extra = {
            **extra,
            "memory_store": memory,
            "append_p99_ratio_vs_memory": ratio(ours, memory, "append_to_journal_ms", "p99"),
            "appends_per_s_ratio_vs_memory": round(
                ours["appends_per_s"] / memory["appends_per_s"], 3
            )
            if memory["appends_per_s"]
            else None,
        }
    p99_audio = ours["commit_to_first_audio_ms"]["p99"]
    heartbeat_ratio = ratio(ours, baseline, "heartbeat_rtt_ms", "p99")
    targets = {
        "commit_to_first_audio_p99_ms_under_50": (
            None if p99_audio is None else p99_audio < TARGET_COMMIT_TO_AUDIO_P99_MS
        ),
        "heartbeat_p99_within_1_5x_echo": (
            None if heartbeat_ratio is None else heartbeat_ratio <= TARGET_HEARTBEAT_RATIO
        ),
    }
    if "redis" in extra:
        targets.update(extra["redis"].pop("targets"))
    if args.store.startswith("sqlite"):
        durable_p99 = ours.get("append_to_journal_ms", {}).get("p99")
        # No answer from an overloaded server is a miss, not an unknown.
        targets["sqlite_append_to_durable_p99_ms_under_30"] = (
            durable_p99 is not None and durable_p99 < TARGET_DURABLE_APPEND_P99_MS
        )
    print(
        json.dumps(
            {
                "bench": "sessions",
                "sessions": args.sessions,
                "seconds": args.seconds,
                "store": args.store,
                "chunk_ms": args.chunk_ms,
                "commit_every_s": args.commit_every_s,
                "cpu_count": os.cpu_count(),
                **validity(*phases),
                **ours,
                "baseline_bare_echo": baseline,
                "heartbeat_rtt_p50_ratio_vs_echo": ratio(ours, baseline, "heartbeat_rtt_ms", "p50"),
                "heartbeat_rtt_p99_ratio_vs_echo": heartbeat_ratio,
                **extra,
                "targets": targets,
            }
        )
    )
