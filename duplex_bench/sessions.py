"""``duplex-server bench sessions``: N clients streaming audio at one server.

Each client appends ``chunk_ms`` of audio every ``chunk_ms``, commits every
``commit_every_s``, acks the journal, and sends a heartbeat every second.
The same clients first run against a bare echo server (the baseline,
measured in the same run), then against duplex-server with the echo model.
The clients run in generator processes on cores of their own
(``load_processes``), so what is measured is the server.

The headline is the server's CPU milliseconds per session-second against
the bare echo server's in the same run (``cpu_per_session_ratio``): a
latency or a session count depends on the machine, that ratio much less.
One JSON line is printed; ratios compare the two phases.
``--find-capacity`` instead searches for the most sessions the server
serves inside the latency target (``capacity``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
import uuid
from dataclasses import dataclass, replace

import psutil

from duplex_bench import capacity
from duplex_bench.echo_server import EchoServerProcess
from duplex_bench.generator import busy_reasons, verdict

# Re-exported: `bench abuse` and `bench soak` drive the same client from here.
from duplex_bench.load_client import BenchClient as BenchClient
from duplex_bench.load_client import Measures as Measures
from duplex_bench.load_client import append_frame as append_frame
from duplex_bench.load_client import merged, quantiles
from duplex_bench.load_processes import (
    CorePlan,
    GeneratorError,
    GeneratorPool,
    Outcome,
    Schedule,
    deal,
    default_generators,
    pinned,
    plan_cores,
    usable_cores,
)
from duplex_bench.server_process import ServerProcess, free_port
from duplex_server.surface import REDIS_SCHEMES, histogram_quantile, parse_histogram

TARGET_COMMIT_TO_AUDIO_P99_MS = 50.0
TARGET_HEARTBEAT_RATIO = 1.5
TARGET_DURABLE_APPEND_P99_MS = 30.0
AUDIO_RECORD_BYTES = 4800  # 100 ms of 24 kHz pcm16: what one append carries

Histogram = list[tuple[float, int]]  # (upper bound in seconds, cumulative count)


@dataclass(frozen=True)
class Load:
    """What one phase runs: how many clients, their pacing, and where the
    server and the generator processes run."""

    sessions: int
    seconds: float
    ramp_s: float
    chunk_ms: int
    commit_every_s: float
    cores: CorePlan
    generators: int

    @property
    def server_cores(self) -> int:
        return 0 if self.cores.server is None else len(self.cores.server)


def _load(args: argparse.Namespace) -> Load:
    available = usable_cores()
    try:
        cores = plan_cores(args.server_cores, available)
    except ValueError as exc:
        raise SystemExit(f"bench sessions: {exc}") from None
    generators = args.generators or default_generators(cores, available)
    return Load(
        args.sessions,
        args.seconds,
        args.ramp_s,
        args.chunk_ms,
        args.commit_every_s,
        cores,
        generators,
    )


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _append_histograms(metrics_urls: list[str] | None) -> Histogram | None:
    """The append-latency histogram summed over servers, or None when an
    overloaded server cannot answer."""
    if metrics_urls is None:
        return None
    total: Histogram | None = None
    for url in metrics_urls:
        try:
            text = _scrape(url)
        except (OSError, TimeoutError):
            return None
        buckets = parse_histogram(text, "duplex_append_latency_seconds")
        total = (
            buckets
            if total is None
            else [(b, n + m) for (b, n), (_, m) in zip(buckets, total, strict=True)]
        )
    return total


def _append_quantiles(before: Histogram | None, after: Histogram | None) -> dict:
    """Append latency over the window: the difference of two scrapes."""
    if before is None or after is None:
        return {"p50": None, "p99": None, "note": "server too loaded to answer /metrics"}
    window = [(b, a - c) for (b, a), (_, c) in zip(after, before, strict=True)]
    p50, p99 = (histogram_quantile(window, q) for q in (0.5, 0.99))
    return {
        "p50": None if p50 is None else round(p50 * 1000, 3),
        "p99": None if p99 is None else round(p99 * 1000, 3),
    }


def _cpu_s(procs: list[psutil.Process]) -> float:
    """The servers' CPU time so far, user and system, all threads."""
    return sum(t.user + t.system for t in (proc.cpu_times() for proc in procs))


def _sleep_until(instant: float) -> None:
    time.sleep(max(0.0, instant - time.monotonic()))


@dataclass(frozen=True)
class ServerWindow:
    """The servers over the measured window."""

    cpu_s: float  # user and system, every server process
    window_s: float
    rss_mib: float  # at the window's end
    append: dict | None  # append→journal quantiles, where /metrics was read


def _watch_servers(
    procs: list[psutil.Process], schedule: Schedule, metrics_urls: list[str] | None
) -> ServerWindow:
    """The scrapes of ``/metrics`` sit outside the CPU window, so the two
    phases' CPU differ only in what the load costs."""
    _sleep_until(schedule.measure_from)
    before = _append_histograms(metrics_urls)
    cpu_before, wall_before = _cpu_s(procs), time.monotonic()
    _sleep_until(schedule.deadline)
    cpu_after, wall_after = _cpu_s(procs), time.monotonic()
    return ServerWindow(
        cpu_s=cpu_after - cpu_before,
        window_s=wall_after - wall_before,
        rss_mib=sum(proc.memory_info().rss for proc in procs) / 2**20,
        append=None
        if metrics_urls is None
        else _append_quantiles(before, _append_histograms(metrics_urls)),
    )


def _phase(name: str, servers: list[ServerProcess], load: Load, metrics: bool) -> dict:
    """Start the servers on their cores, run the load against them, stop them."""
    try:
        with pinned(load.cores.server):
            for server in servers:
                server.start()
        urls = [server.ws_url for server in servers]
        metrics_urls = [server.http_url + "/metrics" for server in servers] if metrics else None
        watched = [psutil.Process(server.pid) for server in servers]
        shares = deal(
            urls, load.sessions, load.generators, load.cores, load.chunk_ms, load.commit_every_s
        )
        with GeneratorPool(shares) as pool:
            schedule = pool.start(load.ramp_s, load.seconds)
            window = _watch_servers(watched, schedule, metrics_urls)
            outcomes = pool.outcomes()
    finally:
        for server in servers:
            server.stop()
    return _phase_report(name, load, window, outcomes)


def _phase_report(name: str, load: Load, server: ServerWindow, outcomes: list[Outcome]) -> dict:
    """One phase's JSON: every generator's samples pooled, the server's CPU
    per session-second, and each generator process judged."""
    measures = merged([outcome.measures for outcome in outcomes])
    generators = [outcome.cpu for outcome in outcomes]
    reasons = busy_reasons(name, generators)
    cpu_ms = server.cpu_s * 1000.0
    result = {
        "appends_per_s": round(measures.appends / load.seconds, 1),
        "heartbeat_rtt_ms": quantiles(measures.heartbeat_rtt),
        "commit_to_first_audio_ms": quantiles(measures.commit_to_audio),
        "server_cpu_percent": round(100.0 * server.cpu_s / server.window_s, 1),
        "server_cpu_ms": round(cpu_ms, 1),
        "server_window_s": round(server.window_s, 3),
        "server_cpu_ms_per_session_second": round(cpu_ms / (load.sessions * server.window_s), 4),
        "server_rss_mib": round(server.rss_mib, 1),
        "errors": measures.errors,
        "connect_failures": measures.connect_failures,
        "generator_cpu_percent": round(max(g.busy_percent for g in generators), 1),
        "generator_saturated": bool(reasons),
        "generator_reasons": reasons,
        "generator_processes": [g.report() for g in generators],
    }
    if server.append is not None:
        result["append_to_journal_ms"] = server.append
    return result


def ratio(ours: dict, base: dict, key: str, q: str) -> float | None:
    """``ours[key][q] / base[key][q]``, None when either is missing."""
    a, b = ours[key][q], base[key][q]
    return None if a is None or not b else round(a / b, 3)


def _server_phase(name: str, load: Load, store: str, port: int = 0, replicas: int = 1) -> dict:
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
            port=port + index if port else None,
            max_sessions=load.sessions + 10,
            replica_id=f"bench-{index}",
        )
        for index in range(replicas)
    ]
    try:
        result = _phase(name, servers, load, metrics=True)
    finally:
        if isolate:
            from duplex_bench.redis_limits import drop_prefix

            drop_prefix(store, isolate[1])
    return {"replicas": replicas, **result}


def _redis_extras(args: argparse.Namespace, load: Load, one: dict) -> dict:
    """Two replicas on the same Redis, the raw XADD ceiling and failover time."""
    from duplex_bench import redis_limits

    two = _server_phase("two replicas", load, args.store, args.port, replicas=2)
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


def _memory_extras(load: Load, ours: dict) -> dict:
    """The same load on the memory store, measured in this run, prices durability."""
    memory = _server_phase("memory store", load, "memory")
    return {
        "memory_store": memory,
        "append_p99_ratio_vs_memory": ratio(ours, memory, "append_to_journal_ms", "p99"),
        "appends_per_s_ratio_vs_memory": round(ours["appends_per_s"] / memory["appends_per_s"], 3)
        if memory["appends_per_s"]
        else None,
    }


def _targets(args: argparse.Namespace, ours: dict, heartbeat_ratio: float | None) -> dict:
    p99_audio = ours["commit_to_first_audio_ms"]["p99"]
    targets = {
        "commit_to_first_audio_p99_ms_under_50": (
            None if p99_audio is None else p99_audio < TARGET_COMMIT_TO_AUDIO_P99_MS
        ),
        "heartbeat_p99_within_1_5x_echo": (
            None if heartbeat_ratio is None else heartbeat_ratio <= TARGET_HEARTBEAT_RATIO
        ),
    }
    if args.store.startswith("sqlite"):
        durable_p99 = ours.get("append_to_journal_ms", {}).get("p99")
        # No answer from an overloaded server is a miss, not an unknown.
        targets["sqlite_append_to_durable_p99_ms_under_30"] = (
            durable_p99 is not None and durable_p99 < TARGET_DURABLE_APPEND_P99_MS
        )
    return targets


def _setup(args: argparse.Namespace, load: Load) -> dict:
    """What every report starts with: the load and where it ran."""
    return {
        "bench": "sessions",
        "store": args.store,
        "seconds": args.seconds,
        "chunk_ms": args.chunk_ms,
        "commit_every_s": args.commit_every_s,
        "cpu_count": os.cpu_count(),
        "server_cores": load.server_cores,
        "generators": load.generators,
        "pinning": load.cores.report(),
    }


def _measure(args: argparse.Namespace, load: Load) -> dict:
    """The bare echo server, then ours (and the store's extras), with the ratios."""
    baseline = _phase("bare echo", [EchoServerProcess()], load, metrics=False)
    ours = _server_phase("duplex-server", load, args.store, args.port)
    phases = [ours, baseline]
    extra: dict = {}
    if args.store.startswith(REDIS_SCHEMES):
        extra["redis"] = _redis_extras(args, load, ours)
        phases.append(extra["redis"]["two_replicas"])
    if args.store != "memory":
        extra.update(_memory_extras(load, ours))
        phases.append(extra["memory_store"])
    heartbeat_ratio = ratio(ours, baseline, "heartbeat_rtt_ms", "p99")
    targets = _targets(args, ours, heartbeat_ratio)
    if "redis" in extra:
        targets.update(extra["redis"].pop("targets"))
    per_session = "server_cpu_ms_per_session_second"
    return {
        "sessions": load.sessions,
        **verdict([reason for phase in phases for reason in phase["generator_reasons"]]),
        "cpu_per_session_ratio": round(ours[per_session] / baseline[per_session], 3)
        if baseline[per_session]
        else None,
        **ours,
        "baseline_bare_echo": baseline,
        "heartbeat_rtt_p50_ratio_vs_echo": ratio(ours, baseline, "heartbeat_rtt_ms", "p50"),
        "heartbeat_rtt_p99_ratio_vs_echo": heartbeat_ratio,
        **extra,
        "targets": targets,
    }


def _capacity(args: argparse.Namespace, load: Load) -> dict:
    """Probes of ``--seconds`` each against our server alone (no baseline:
    the question is how many sessions, not what each costs)."""

    def probe(sessions: int) -> capacity.Probe:
        phase = _server_phase("probe", replace(load, sessions=sessions), args.store, args.port)
        passed = capacity.passes(phase, TARGET_COMMIT_TO_AUDIO_P99_MS)
        return capacity.Probe(sessions, passed, {"sessions": sessions, "passed": passed, **phase})

    search = capacity.find_capacity(probe, args.sessions, args.max_probes)
    best = search.best_pass
    reasons = [
        f"{p.sessions} sessions: {reason}"
        for p in search.probes
        for reason in p.report["generator_reasons"]
    ]
    return {
        **verdict(reasons),
        "target_commit_to_first_audio_p99_ms": TARGET_COMMIT_TO_AUDIO_P99_MS,
        "capacity_sessions": best,
        "capacity_sessions_per_server_core": (
            round(best / load.server_cores, 1) if best is not None and load.server_cores else None
        ),
        "bracket": [best, search.first_fail],
        "converged": search.converged,
        "probes": [p.report for p in search.probes],
    }


def run(args: argparse.Namespace) -> None:
    load = _load(args)
    try:
        if args.find_capacity:
            report = {**_setup(args, load), "find_capacity": True, **_capacity(args, load)}
        else:
            report = {**_setup(args, load), **_measure(args, load)}
    except GeneratorError as exc:
        raise SystemExit(f"bench sessions: {exc}") from None
    print(json.dumps(report))
