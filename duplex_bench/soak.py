"""``duplex-server bench soak``: does the server grow with the sessions it
has served?

Churn clients open a session, stream ``--churn-audio-ms`` of audio, commit,
wait for the whole answer and close, over and over; beside them a few
streaming sessions talk for ``--stream-session-s`` at a time (so the
server always holds live sessions too). Every ``--sample-s`` the bench
samples the server's RSS and open file descriptors, the store's size and
the interval's latency percentiles, against the sessions served so far.

The headline is the RSS slope in MB per 1,000 sessions served, fitted over
the samples after warm-up (``--warmup``: the fraction of the run's sessions
after which the server's caches, arenas and pools have settled). A server
that keeps something of every session it served shows a slope; one that
does not, a flat line. The JSON gives every sample; ``--plot`` draws RSS,
fds and p99 latency against sessions served (matplotlib).

``--long-calls`` asks the other question, of one call's length instead of
the number of calls: duplex_bench/long_calls.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import websockets

from duplex_bench.generator import GeneratorCpu, validity
from duplex_bench.progress import bar
from duplex_bench.server_process import ServerProcess
from duplex_bench.sessions import BenchClient, Measures, append_frame, quantiles
from duplex_server.surface import REDIS_SCHEMES, connect_redis

TARGET_SLOPE_MB_PER_1000 = 0.05
DEFAULT_SAMPLE_S = 2.0  # --sample-s without --long-calls
RECONNECT_PAUSE_S = 0.1  # after a failed session, before the next
# A churn session that has not ended this long after it began is given up
# (counted as failed): the run must end, and print, whatever the server does.
SESSION_PATIENCE_S = 60.0


class CloseRefused(Exception):
    """The server answered ``session.close`` with an error (the store could
    not record it): the session stays open, so no close of the socket comes."""


@dataclass
class Tally:
    """What the churn clients counted since the last sample."""

    served: int = 0
    failed: int = 0
    commit_to_first_audio: list[float] = field(default_factory=list)


class Churner:
    """One client that serves sessions back to back until told to stop."""

    def __init__(self, url: str, frames: list[str], tally: Tally) -> None:
        self.url = url
        self.frames = frames
        self.tally = tally

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                async with asyncio.timeout(SESSION_PATIENCE_S):
                    await self._one_session()
            except (OSError, websockets.WebSocketException, CloseRefused):
                # (the patience running out is a TimeoutError, an OSError)
                self.tally.failed += 1
                await asyncio.sleep(RECONNECT_PAUSE_S)
            else:
                self.tally.served += 1

    async def _one_session(self) -> None:
        loop = asyncio.get_running_loop()
        async with websockets.connect(self.url, max_size=None, ping_interval=None) as ws:
            await ws.recv()  # session.created
            for frame in self.frames:
                await ws.send(frame)
            committed = loop.time()
            await ws.send('{"type":"input_audio_buffer.commit"}')
            first_audio = None
            async for message in ws:
                head = message[:48]  # the type comes first: no parse of audio deltas
                if first_audio is None and '"response.output_audio.delta"' in head:
                    first_audio = loop.time()
                    self.tally.commit_to_first_audio.append(first_audio - committed)
                elif '"response.done"' in head:
                    break
            await ws.send('{"type":"session.close"}')
            async for message in ws:  # until the server closes the socket
                if '"type":"error"' in message[:48]:
                    raise CloseRefused(message[:300])


class StoreSize:
    """Bytes the store holds: the SQLite file with its WAL, Redis's
    ``used_memory``; None on the memory store (it is in the RSS)."""

    def __init__(self, store: str) -> None:
        self.store = store
        # The store's own client: every URL the server takes, sentinels too.
        self._redis = connect_redis(store) if store.startswith(REDIS_SCHEMES) else None

    async def bytes(self) -> int | None:
        if self.store.startswith("sqlite:"):
            path = Path(self.store.removeprefix("sqlite:"))
            files = (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))
            return sum(f.stat().st_size for f in files if f.exists())
        if self._redis is not None:
            return int((await self._redis.info("memory"))["used_memory"])
        return None

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()


def rss_slope(samples: list[dict], warmup: float) -> float | None:
    """MB of RSS per 1,000 sessions served, least squares over the samples
    past the warm-up; None with fewer than three of them."""
    if not samples:
        return None
    start = samples[-1]["sessions_served"] * warmup
    kept = [s for s in samples if s["sessions_served"] >= start]
    if len(kept) < 3 or kept[-1]["sessions_served"] == kept[0]["sessions_served"]:
        return None
    served = np.array([s["sessions_served"] for s in kept]) / 1000.0
    rss = np.array([s["rss_mib"] for s in kept])
    return round(float(np.polyfit(served, rss, 1)[0]), 4)


async def _sample_forever(
    server: psutil.Process,
    tally: Tally,
    streams: Measures,
    store: StoreSize,
    args: argparse.Namespace,
    stop: asyncio.Event,
) -> list[dict]:
    samples: list[dict] = []
    served = failed = 0
    began = time.monotonic()
    generator = GeneratorCpu()
    generator.start()
    shown = bar(args, "soak", args.sessions or None, "session")
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.sample_s)
            shown.update(tally.served)
            served += tally.served
            failed += tally.failed
            latencies = tally.commit_to_first_audio
            tally.served = tally.failed = 0
            tally.commit_to_first_audio = []
            heartbeats, streams.heartbeat_rtt = streams.heartbeat_rtt, []
            streams.commit_to_audio.clear()  # the churners' figure is the headline
            sample = {
                "t_s": round(time.monotonic() - began, 1),
                "sessions_served": served,
                "sessions_failed": failed,
                "rss_mib": round(server.memory_info().rss / 2**20, 2),
                "open_fds": server.num_fds(),
                "store_bytes": await store.bytes(),
                "commit_to_first_audio_ms": quantiles(latencies),
                "stream_heartbeat_rtt_ms": quantiles(heartbeats),
                **generator.report(),
            }
            samples.append(sample)
            shown.set_postfix(rss_mib=sample["rss_mib"], failed=failed, refresh=False)
            if args.samples_file:
                with open(args.samples_file, "a") as out:
                    out.write(json.dumps(sample) + "\n")
            generator.start()
            done = (args.sessions and served >= args.sessions) or (
                args.seconds and time.monotonic() - began >= args.seconds
            )
            if done:
                stop.set()
    finally:
        shown.close()
    return samples


async def live_phase(server: ServerProcess, args: argparse.Namespace) -> dict | None:
    """What one live session costs: ``--live-sessions`` sessions stream for
    ``--live-s`` (appending, committing every ``--commit-every-s`` and
    acknowledging the journal, as the streaming sessions do); the server's
    RSS they add at their peak, and the store bytes they add, per session
    and per session-minute."""
    if not args.live_sessions:
        return None
    loop = asyncio.get_running_loop()
    process = psutil.Process(server.pid)
    store = StoreSize(server.store)
    try:
        rss_before, store_before = process.memory_info().rss, await store.bytes()
        deadline = loop.time() + args.live_s
        frame = append_frame(args.chunk_ms)
        measures = Measures()
        clients = [
            BenchClient(server.ws_url, frame, args, measures, deadline, measure_from=0.0)
            for _ in range(args.live_sessions)
        ]
        tasks = [asyncio.create_task(c.run(i * 0.02)) for i, c in enumerate(clients)]
        peak = rss_before
        with bar(args, "live sessions", args.live_s, "s") as shown:
            while loop.time() < deadline:
                await asyncio.sleep(1.0)
                peak = max(peak, process.memory_info().rss)
                shown.update(min(loop.time(), deadline) - (deadline - args.live_s) - shown.n)
        store_after = await store.bytes()
        await asyncio.gather(*tasks)
    finally:
        await store.close()
    session_minutes = args.live_sessions * args.live_s / 60.0
    return {
        "live_sessions": args.live_sessions,
        "live_s": args.live_s,
        "rss_mib_before_peak": [round(rss_before / 2**20, 1), round(peak / 2**20, 1)],
        "memory_per_live_session_mib": round((peak - rss_before) / 2**20 / args.live_sessions, 3),
        "store_mib_per_session_minute": (
            None
            if store_before is None or store_after is None
            else round((store_after - store_before) / 2**20 / session_minutes, 3)
        ),
        "errors": measures.errors,
        "connect_failures": measures.connect_failures,
    }


async def _renew_every(clients: list[BenchClient], period_s: float, stop: asyncio.Event) -> None:
    """The streaming sessions live ``period_s`` each, then start afresh."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)
        for client in clients:
            client.renew()


async def _drive(server: ServerProcess, args: argparse.Namespace) -> list[dict]:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    tally = Tally()
    chunk = append_frame(args.chunk_ms)
    churners = [
        Churner(server.ws_url, [chunk] * max(1, args.churn_audio_ms // args.chunk_ms), tally)
        for _ in range(args.churn_clients)
    ]
    streams = Measures()
    streamers = [
        BenchClient(server.ws_url, chunk, args, streams, float("inf"), measure_from=0.0)
        for _ in range(args.streaming)
    ]
    tasks = [asyncio.create_task(c.run(stop)) for c in churners]
    tasks += [asyncio.create_task(s.run(i * 0.1)) for i, s in enumerate(streamers)]
    renewing = asyncio.create_task(_renew_every(streamers, args.stream_session_s, stop))
    store = StoreSize(server.store)
    try:
        samples = await _sample_forever(
            psutil.Process(server.pid), tally, streams, store, args, stop
        )
    finally:
        await store.close()
    for streamer in streamers:
        streamer.deadline = loop.time()  # the senders stop at their next tick
    await asyncio.gather(*tasks, renewing)
    return samples


def plot(samples: list[dict], path: str, title: str) -> None:
    """RSS, open fds and p99 commit→first-audio against sessions served."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    served = [s["sessions_served"] / 1000.0 for s in samples]
    p99 = [s["commit_to_first_audio_ms"]["p99"] for s in samples]
    figure, (rss, fds, latency) = plt.subplots(3, 1, sharex=True, figsize=(8, 8))
    rss.plot(served, [s["rss_mib"] for s in samples])
    rss.set_ylabel("server RSS (MiB)")
    fds.plot(served, [s["open_fds"] for s in samples])
    fds.set_ylabel("open fds")
    latency.plot(served, [float("nan") if v is None else v for v in p99])
    latency.set_ylabel("p99 commit→first audio (ms)")
    latency.set_xlabel("sessions served (thousands)")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run(args: argparse.Namespace) -> None:
    if args.long_calls:
        from duplex_bench import long_calls

        long_calls.run(args)
        return
    if args.sample_s is None:
        args.sample_s = DEFAULT_SAMPLE_S
    if not (args.sessions or args.seconds or args.live_sessions):
        raise SystemExit("bench soak: give --sessions, --seconds or --live-sessions")
    with tempfile.TemporaryDirectory(prefix="duplex-soak-") as tmp:
        store = f"sqlite:{Path(tmp) / 'soak.db'}" if args.store == "sqlite" else args.store
        server = ServerProcess(store, retention_s=args.retention_s).start()
        try:
            live = asyncio.run(live_phase(server, args))
            samples = asyncio.run(_drive(server, args)) if args.sessions or args.seconds else []
        finally:
            server.stop()
    result: dict = {"bench": "soak", "store": args.store, "cpu_count": os.cpu_count(), "live": live}
    if samples:
        result.update(_churn_report(samples, args))
    print(json.dumps(result))


def _churn_report(samples: list[dict], args: argparse.Namespace) -> dict:
    slope = rss_slope(samples, args.warmup)
    last = samples[-1]
    if args.plot:
        plot(samples, args.plot, f"bench soak, {args.store}: slope {slope} MB / 1,000 sessions")
    return {
        "churn_clients": args.churn_clients,
        "streaming_sessions": args.streaming,
        "retention_s": args.retention_s,
        **validity(*samples),
        "sessions_served": last["sessions_served"],
        "sessions_failed": last["sessions_failed"],
        "duration_s": last["t_s"],
        "sessions_per_s": round(last["sessions_served"] / last["t_s"], 1) if last["t_s"] else None,
        "rss_slope_mb_per_1000_sessions": slope,
        "rss_mib_first_last": [samples[0]["rss_mib"], last["rss_mib"]],
        "targets": {
            "rss_slope_under_0_05_mb_per_1000": slope is not None
            and slope < TARGET_SLOPE_MB_PER_1000,
        },
        "plot": args.plot,
        "samples": samples,
    }
