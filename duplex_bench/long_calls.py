"""``duplex-server bench soak --long-calls``: does a long call cost the store
more the longer it runs (issue 41)?

``--calls`` sessions talk continuously for ``--seconds`` on each store of
``--stores`` in turn: ``redis`` (plain ``--store redis://``, a fresh
redis-server of its own), ``redis-media`` (the same with ``--media-dir`` in
a temp dir: audio sealed out of Redis into segments), ``sqlite`` and
``sqlite-media`` (audio sealed out of the database file likewise). Each
session is a client streaming the people's recordings (duplex_bench/
recorded_speech.py) looped at real time in 100 ms appends, server VAD on,
every answer drained. Three figures per store:

- the store's memory over time (Redis ``used_memory`` above its level
  before the calls, the SQLite file with its WAL, the media directory on
  disk), sampled every ``--sample-s``, and its slope in MB per
  session-hour: a least-squares fit over the second half of the run, so a
  store that holds only a bounded window shows about 0;
- refold time against call length: the protocol's restore through the
  store client on ``duplex_server.surface`` (the latest snapshot, the
  records after it, ``fold``), the full fold from seq 1, and the server's
  events route (a full read, media resolved by the server), each for one
  long session and for a fresh tiny one, in the same run;
- the append path's latency over time, from the server's own histograms
  on ``/metrics`` per sample window: the store's append
  (``duplex_store_append_seconds``, what a longer log would slow) and frame
  received -> its records appended (``duplex_append_latency_seconds``,
  queueing in the session included), p99 of the first half of the call
  against the second; and as a client sees it, a heartbeat round trip each
  second on every session (``session.heartbeat`` -> ``session.heartbeat_ack``,
  which waits for every command sent before it, so behind a turn's
  recognition: ``duplex_stage_seconds{stage="asr"}`` is sampled beside it).

Then, with ``--hour-call-s`` (default an hour), one call that long on the
same store, compressed: an echo server with no input rate bound takes the
looped speech as fast as it answers (a commit every 2 s of audio, each
answer awaited), so an hour of call is logged in minutes through the same
append, seal and snapshot path. Its store growth and its refold are
measured at that length, not extrapolated from the short calls.

The generator's CPU is sampled per window; a window where it saturated
marks the run invalid (duplex_bench/generator.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import statistics
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import websockets

from duplex_bench import recorded_speech
from duplex_bench.generator import GeneratorCpu, validity
from duplex_bench.progress import bar
from duplex_bench.redis_process import RedisServer
from duplex_bench.server_process import ServerProcess
from duplex_server.surface import (
    BlobStore,
    RedisLog,
    SqliteLog,
    build_model,
    connect_redis,
    fold,
    histogram_quantile,
    initial_state,
    parse_histogram,
    resample_pcm16,
)

STORES = ("redis", "redis-media", "sqlite", "sqlite-media")
DEFAULT_SECONDS = 120.0
DEFAULT_SAMPLE_S = 15.0
RATE_HZ = 24_000
CHUNK_MS = 100
PAUSE_S = 1.0  # silence between the looped utterances, so server VAD ends turns
BASELINE_S = 2.0  # the tiny session's audio: the refold baseline
ECHO_TURN_S = 2.0  # --model echo (no server VAD): a commit this often
MIN_WINDOW_S = 1.0  # a shorter last window is left out of the samples
SETTLE_S = 6.0  # after the calls: the sealer's 5 s period, and the last appends
TARGET_REDIS_MEDIA_MB_PER_SESSION_HOUR = 20.0
TARGET_REFOLD_ONE_HOUR_MS = 1000.0
TARGET_P99_LAST_OVER_FIRST = 1.5
REFOLD_REPEATS = 3  # the median of these
SECONDS_PER_HOUR = 3600.0
# The server's histograms sampled per window: (metric, labels).
SERVER_HISTOGRAMS = {
    "store_append": ("duplex_store_append_seconds", None),
    "append": ("duplex_append_latency_seconds", None),
    "asr": ("duplex_stage_seconds", {"stage": "asr"}),
}
Buckets = list[tuple[float, int]]  # (upper bound in seconds, cumulative count)


def speech_pcm24(speech_dir: str) -> bytes:
    """Every recording once, with a pause after each, as 24 kHz pcm16: one loop."""
    utterances = recorded_speech.load_for("soak --long-calls", speech_dir)
    pause = bytes(2 * int(recorded_speech.SAMPLE_RATE_HZ * PAUSE_S))
    pcm16k = b"".join(u.pcm16 + pause for u in utterances)
    return resample_pcm16(pcm16k, recorded_speech.SAMPLE_RATE_HZ, RATE_HZ)


def append_frames(pcm: bytes, offset: int) -> list[str]:
    """The loop as 100 ms append events, starting ``offset`` chunks in."""
    size = RATE_HZ * 2 * CHUNK_MS // 1000
    chunks = [pcm[i : i + size].ljust(size, b"\0") for i in range(0, len(pcm), size)]
    chunks = chunks[offset % len(chunks) :] + chunks[: offset % len(chunks)]
    return [
        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(c).decode()})
        for c in chunks
    ]


@dataclass
class Probe:
    """What the callers saw, since the last sample and in all."""

    heartbeats: list[float] = field(default_factory=list)  # (s) this window
    answers: int = 0
    errors: int = 0
    first_error: str | None = None
    appends: int = 0
    session_ids: list[str] = field(default_factory=list)


class Caller:
    """One long call: a paced sender of the looped speech, a heartbeat each
    second, and a reader that drains every answer."""

    def __init__(self, url: str, frames: list[str], probe: Probe, vad: bool) -> None:
        self.url = url
        self.frames = frames
        self.probe = probe
        # server VAD ends the turns (the cascade); without it (echo), a
        # commit every ECHO_TURN_S does
        self.vad = vad
        self._heartbeat_sent: float | None = None

    async def run(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        async with websockets.connect(self.url, max_size=None, ping_interval=None) as ws:
            created = json.loads(await ws.recv())
            self.probe.session_ids.append(created["session"]["id"])
            if self.vad:
                await ws.send(
                    '{"type":"session.update","session":{"turn_detection":{"type":"server_vad"}}}'
                )
            reader = asyncio.create_task(self._drain(ws))
            began = loop.time()
            per_heartbeat = 1000 // CHUNK_MS
            per_commit = int(ECHO_TURN_S * 1000) // CHUNK_MS
            tick = 0
            try:
                while loop.time() - began < seconds and not reader.done():
                    await ws.send(self.frames[tick % len(self.frames)])
                    self.probe.appends += 1
                    if tick % per_heartbeat == 0 and self._heartbeat_sent is None:
                        self._heartbeat_sent = loop.time()
                        await ws.send('{"type":"session.heartbeat"}')
                    tick += 1
                    if not self.vad and tick % per_commit == 0:
                        await ws.send('{"type":"input_audio_buffer.commit"}')
                    await asyncio.sleep(max(0.0, began + tick * CHUNK_MS / 1000 - loop.time()))
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, websockets.WebSocketException):
                    await reader
        # The socket closes without session.close: the call stays in the store.

    async def _drain(self, ws) -> None:
        loop = asyncio.get_running_loop()
        async for message in ws:
            head = message[:48] if isinstance(message, str) else ""
            if '"session.heartbeat_ack"' in head and self._heartbeat_sent is not None:
                self.probe.heartbeats.append(loop.time() - self._heartbeat_sent)
                self._heartbeat_sent = None
            elif '"response.done"' in head:
                self.probe.answers += 1
            elif '"type":"error"' in head:
                self.probe.errors += 1
                self.probe.first_error = self.probe.first_error or str(message)[:300]


class CompressedCaller:
    """One call of ``seconds`` of the looped speech, as fast as an echo
    server without an input rate bound takes it: a turn's appends, its
    commit, and its answer awaited before the next turn (so the session's
    mailbox never overflows and every answer is logged whole)."""

    def __init__(self, url: str, frames: list[str], probe: Probe) -> None:
        self.url = url
        self.frames = frames
        self.probe = probe

    async def run(self, seconds: float) -> None:
        per_turn = int(ECHO_TURN_S * 1000) // CHUNK_MS
        turns = max(1, int(seconds / ECHO_TURN_S))
        async with websockets.connect(self.url, max_size=None, ping_interval=None) as ws:
            created = json.loads(await ws.recv())
            self.probe.session_ids.append(created["session"]["id"])
            for turn in range(turns):
                for i in range(per_turn):
                    await ws.send(self.frames[(turn * per_turn + i) % len(self.frames)])
                self.probe.appends += per_turn
                await ws.send('{"type":"input_audio_buffer.commit"}')
                await self._answer(ws)

    async def _answer(self, ws) -> None:
        async for message in ws:
            head = message[:48] if isinstance(message, str) else ""
            if '"response.done"' in head:
                self.probe.answers += 1
                return
            if '"type":"error"' in head:
                self.probe.errors += 1
                self.probe.first_error = self.probe.first_error or str(message)[:300]
                return


class StoreMeter:
    """The bytes a store holds: Redis's ``used_memory`` above its level at
    the start, the SQLite file with its WAL, the media directory on disk."""

    def __init__(self, redis_url: str | None, sqlite: Path | None, media: Path | None) -> None:
        self._redis = connect_redis(redis_url) if redis_url else None
        self._sqlite = sqlite
        self._media = media
        self._redis_before = 0

    async def start(self) -> None:
        if self._redis is not None:
            self._redis_before = await self._used_memory()

    async def _used_memory(self) -> int:
        assert self._redis is not None
        return int((await self._redis.info("memory"))["used_memory"])

    async def sample(self) -> dict:
        out: dict = {}
        if self._redis is not None:
            out["redis_used_memory_delta_bytes"] = await self._used_memory() - self._redis_before
        if self._sqlite is not None:
            files = (self._sqlite, self._sqlite.with_name(self._sqlite.name + "-wal"))
            out["sqlite_bytes"] = sum(f.stat().st_size for f in files if f.exists())
        if self._media is not None:
            out["media_dir_bytes"] = dir_bytes(self._media)
        return out

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()


class ServerMeter:
    """The server's own latency histograms (``SERVER_HISTOGRAMS``), read from
    ``/metrics``: each :meth:`window` gives what was observed since the last."""

    def __init__(self, server: ServerProcess) -> None:
        self._url = f"{server.http_url}/metrics"
        self._last: dict[str, Buckets] = {}

    async def start(self) -> None:
        self._last = await self._scrape()

    async def _scrape(self) -> dict[str, Buckets]:
        def read() -> str:
            with urllib.request.urlopen(self._url, timeout=30) as reply:
                return reply.read().decode()

        text = await asyncio.to_thread(read)
        return {key: parse_histogram(text, *series) for key, series in SERVER_HISTOGRAMS.items()}

    async def window(self) -> dict[str, Buckets]:
        now = await self._scrape()
        since = {key: between(self._last.get(key, []), buckets) for key, buckets in now.items()}
        self._last = now
        return since


def between(before: Buckets, after: Buckets) -> Buckets:
    """The observations of ``after`` that ``before`` had not seen yet."""
    earlier = dict(before)
    return [(bound, count - earlier.get(bound, 0)) for bound, count in after]


def summed(windows: list[Buckets]) -> Buckets:
    """Several windows' observations as one histogram."""
    bounds = next((w for w in windows if w), [])
    return [(bound, sum(dict(w).get(bound, 0) for w in windows)) for bound, _ in bounds]


def quantile_ms(buckets: Buckets, q: float = 0.99) -> float | None:
    value = histogram_quantile(buckets, q)
    return None if value is None else round(value * 1000.0, 3)


def window_figures(windows: dict[str, Buckets]) -> dict:
    """A sample window's p99 and count of each server histogram."""
    out: dict = {}
    for key, buckets in windows.items():
        out[f"{key}_p99_ms"] = quantile_ms(buckets)
        out[f"{key}_count"] = buckets[-1][1] if buckets else 0
    return out


def dir_bytes(path: Path) -> int:
    """Bytes on disk of every file under ``path`` (allocated blocks)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def slope_mb_per_session_hour(samples: list[dict], key: str, calls: int) -> float | None:
    """Least squares of ``key`` against time over the second half of the
    run, in MB per session-hour; None with fewer than three samples there."""
    if not samples or key not in samples[-1]:
        return None
    half = samples[-1]["t_s"] / 2
    kept = [s for s in samples if s["t_s"] >= half]
    if len(kept) < 3:
        return None
    t = np.array([s["t_s"] for s in kept])
    size = np.array([s[key] for s in kept]) / 1e6
    per_s = float(np.polyfit(t, size, 1)[0])
    return round(per_s * SECONDS_PER_HOUR / calls, 2)


def p99_ms(samples_s: list[float]) -> float | None:
    if not samples_s:
        return None
    return round(float(np.percentile(np.array(samples_s) * 1000.0, 99)), 3)


async def talk(
    server: ServerProcess, meter: StoreMeter, pcm: bytes, args: argparse.Namespace, label: str
) -> tuple[list[dict], Probe, list[dict[str, Buckets]]]:
    """The long calls, sampled every ``--sample-s`` until they end; the
    server's histograms of each window beside the samples."""
    probe = Probe()
    server_meter = ServerMeter(server)
    histograms: list[dict[str, Buckets]] = []
    loop_chunks = len(pcm) // (RATE_HZ * 2 * CHUNK_MS // 1000)
    callers = [
        Caller(
            server.ws_url,
            append_frames(pcm, i * loop_chunks // args.calls),
            probe,
            vad=args.long_model == "cascade",
        )
        for i in range(args.calls)
    ]
    await meter.start()
    await server_meter.start()
    generator = GeneratorCpu()
    generator.start()
    began = time.monotonic()
    server_process = psutil.Process(server.pid)
    server_process.cpu_percent(None)
    samples = [{"t_s": 0.0, **await meter.sample()}]
    tasks = [asyncio.create_task(c.run(args.long_seconds)) for c in callers]
    shown = bar(args, f"long calls, {label}", args.long_seconds, "s")
    try:
        while not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=args.long_sample_s)
            if time.monotonic() - began - samples[-1]["t_s"] < MIN_WINDOW_S:
                continue  # the calls ended just after a sample: no window of its own
            heartbeats, probe.heartbeats = probe.heartbeats, []
            histograms.append(await server_meter.window())
            sample = {
                "t_s": round(time.monotonic() - began, 1),
                **await meter.sample(),
                **window_figures(histograms[-1]),
                "heartbeat_rtt_p99_ms": p99_ms(heartbeats),
                "heartbeats": len(heartbeats),
                # the server's, of one core (the heartbeat waits behind its work)
                "server_cpu_percent": round(server_process.cpu_percent(None), 1),
                **generator.report(),
            }
            samples.append(sample)
            generator.start()
            shown.update(min(sample["t_s"], args.long_seconds) - shown.n)
    finally:
        shown.close()
    for task in tasks:
        task.result()  # a caller that failed fails the bench, saying why
    return samples, probe, histograms


async def tiny_call(server: ServerProcess, pcm: bytes, args: argparse.Namespace) -> str:
    """A fresh session with ``BASELINE_S`` of speech: the refold baseline."""
    probe = Probe()
    frames = append_frames(pcm[: 2 * int(RATE_HZ * BASELINE_S)], 0)
    await Caller(server.ws_url, frames, probe, vad=args.long_model == "cascade").run(BASELINE_S)
    return probe.session_ids[0]


def events_route_ms(server: ServerProcess, session_id: str) -> tuple[float, int]:
    """The events route's whole log, read by the server (media resolved):
    milliseconds to the last byte, and the records it gave."""
    began = time.perf_counter()
    with urllib.request.urlopen(f"{server.http_url}/v1/sessions/{session_id}/events") as reply:
        lines = reply.read().count(b"\n")
    return round((time.perf_counter() - began) * 1000.0, 2), lines


async def refolds(log: RedisLog | SqliteLog, session_id: str, model_name: str, full: bool) -> dict:
    """The restore's read and fold (latest snapshot on) and the full fold,
    each the median of a few, through the surface's store client."""
    model = build_model(model_name, asr="pocketsphinx")  # only its turn detections are used

    def blank():
        return initial_state(session_id, model.name, model.turn_detection_types)

    async def restore() -> int:
        at = await log.latest_snapshot(session_id)
        records = await log.read(session_id, after_seq=max(0, at - 1))
        fold(records, blank())
        return len(records)

    async def whole() -> int:
        records = await log.read(session_id)
        fold(records, blank())
        return len(records)

    async def timed(work) -> tuple[float, int]:
        times, count = [], 0
        for _ in range(REFOLD_REPEATS):
            began = time.perf_counter()
            count = await work()
            times.append(time.perf_counter() - began)
        return round(statistics.median(times) * 1000.0, 2), count

    restore_ms, restore_records = await timed(restore)
    out = {
        "snapshot_seq": await log.latest_snapshot(session_id),
        "restore_ms": restore_ms,
        "restore_records": restore_records,
    }
    if full:
        out["full_fold_ms"], out["full_fold_records"] = await timed(whole)
    return out


@dataclass
class LiveRun:
    """What the long calls and the tiny one left: the samples (and the
    server's histograms of each window), the callers' view, the store at
    the end, and the events route's read of each session (ms, records)."""

    samples: list[dict]
    probe: Probe
    histograms: list[dict[str, Buckets]]
    final: dict
    route: dict[str, tuple[float, int]]


async def _live(
    server: ServerProcess, meter: StoreMeter, pcm: bytes, args: argparse.Namespace, kind: str
) -> LiveRun:
    """The long calls, then the tiny one; the store at the end; the events
    route's read of each."""
    try:
        samples, probe, histograms = await talk(server, meter, pcm, args, kind)
        long_id = probe.session_ids[0]
        tiny_id = await tiny_call(server, pcm, args)
        await asyncio.sleep(SETTLE_S)  # the last appends land (and, with --media-dir, seal)
        final = await meter.sample()
    finally:
        await meter.close()
    route = {
        sid: await asyncio.to_thread(events_route_ms, server, sid) for sid in (long_id, tiny_id)
    }
    return LiveRun(samples, probe, histograms, final, route)


async def hour_call(
    store: str, flags: dict, meter: StoreMeter, pcm: bytes, args: argparse.Namespace
) -> dict:
    """``--hour-call-s`` of call, compressed, on an echo server of the same
    store: the store's growth over it (the last sample taken with the server
    stopped, everything sealed), the server's CPU, and the events route's
    read of the session."""
    echo_flags = {k: v for k, v in flags.items() if k != "asr"}
    server = ServerProcess(
        store, model="echo", max_input_realtime_factor=0, max_session_media_bytes=0, **echo_flags
    )
    await meter.start()
    probe = Probe()
    try:
        before = await meter.sample()
        await asyncio.to_thread(server.start, timeout_s=120)
        try:
            process = psutil.Process(server.pid)
            began, cpu_before = time.monotonic(), sum(process.cpu_times()[:2])
            await CompressedCaller(server.ws_url, append_frames(pcm, 0), probe).run(
                args.hour_call_s
            )
            wall_s = time.monotonic() - began
            server_cpu_s = sum(process.cpu_times()[:2]) - cpu_before
            session_id = probe.session_ids[0]
            route_ms, events = await asyncio.to_thread(events_route_ms, server, session_id)
        finally:
            await asyncio.to_thread(server.stop)
        after = await meter.sample()
    finally:
        await meter.close()
    growth = {k: after[k] - before[k] for k in after}
    return {
        "session_id": session_id,
        "call_s": args.hour_call_s,
        "wall_s": round(wall_s, 1),
        "server_cpu_s": round(server_cpu_s, 1),
        "appends": probe.appends,
        "answers": probe.answers,
        "errors": probe.errors,
        "first_error": probe.first_error,
        "growth_bytes": growth,
        "growth_mb_per_session_hour": {
            k: round(v / 1e6 * SECONDS_PER_HOUR / args.hour_call_s, 2) for k, v in growth.items()
        },
        "events_route_ms": route_ms,
        "events": events,
    }


async def _refold_all(
    log: RedisLog | SqliteLog, sessions: dict[str, str], full: bool
) -> dict[str, dict]:
    """Each session's refolds (``sessions``: id -> its server's model)."""
    try:
        return {sid: await refolds(log, sid, model, full) for sid, model in sessions.items()}
    finally:
        await log.close()


def one_store(kind: str, pcm: bytes, args: argparse.Namespace, tmp: Path) -> dict:
    redis = RedisServer(tmp / "redis").start() if kind.startswith("redis") else None
    media = tmp / "media" if kind.endswith("-media") else None
    sqlite = tmp / "long.db" if kind.startswith("sqlite") else None
    store = redis.url if redis is not None else f"sqlite:{sqlite}"
    flags: dict = {"asr": args.asr} if args.long_model == "cascade" else {}
    if media is not None:
        flags["media_dir"] = media
    if args.retain_audio != "all":
        flags["retain_audio"] = args.retain_audio
    try:
        server = ServerProcess(store, model=args.long_model, **flags).start(timeout_s=120)
        try:
            meter = StoreMeter(redis.url if redis else None, sqlite, media)
            live = asyncio.run(_live(server, meter, pcm, args, kind))
        finally:
            server.stop()
        sessions = dict.fromkeys(live.route, args.long_model)
        hour = None
        if args.hour_call_s:
            meter = StoreMeter(redis.url if redis else None, sqlite, media)
            hour = asyncio.run(hour_call(store, flags, meter, pcm, args))
            sessions[hour["session_id"]] = "echo"
        # The server has stopped (sealed what it held): the store is at rest.
        log: RedisLog | SqliteLog
        if redis is not None:
            log = RedisLog(redis.url)
        else:
            assert sqlite is not None
            log = SqliteLog(sqlite, open_media=BlobStore)  # the folder the database names
        # Without the media directory a Redis client cannot read the archived
        # records (the media store is not on the surface): the full read
        # there is the server's events route.
        full = kind != "redis-media"
        folds = asyncio.run(_refold_all(log, sessions, full))
    finally:
        if redis is not None:
            redis.stop()
    return _store_report(kind, args, live, media, folds, hour)


def _store_report(
    kind: str,
    args: argparse.Namespace,
    live: LiveRun,
    media: Path | None,
    folds: dict[str, dict],
    hour: dict | None,
) -> dict:
    samples, probe, final = live.samples, live.probe, live.final
    keys = [
        k
        for k in ("redis_used_memory_delta_bytes", "sqlite_bytes", "media_dir_bytes")
        if k in final
    ]
    slopes = {k: slope_mb_per_session_hour(samples, k, args.calls) for k in keys}
    refold = _refold_report(kind, args.long_seconds, folds, live.route, hour)
    latency = latency_over_time(samples, live.histograms)
    report = {
        "store": kind,
        "retain_audio": args.retain_audio,
        "server_cpu_percent_max": max((s["server_cpu_percent"] for s in samples[1:]), default=None),
        **validity(*samples[1:]),
        "generator_cpu_percent_max": max(
            (s["generator_cpu_percent"] for s in samples[1:]), default=None
        ),
        "calls": args.calls,
        "appends": probe.appends,
        "answers": probe.answers,
        "errors": probe.errors,
        "first_error": probe.first_error,
        "final": {k: final[k] for k in keys},
        "slope_mb_per_session_hour": slopes,
        "latency": latency,
        "refold": refold,
        "hour_call": hour,
        "media_dir_files": sum(len(f) for _r, _d, f in os.walk(media)) if media else None,
        "samples": samples,
    }
    report["targets"] = _targets(kind, slopes, latency, refold, hour)
    return report


def latency_over_time(samples: list[dict], histograms: list[dict[str, Buckets]]) -> dict:
    """The server's append latencies, p99 of the call's first half of
    windows against its second half (one window's p99 swings with whatever
    it happened to hold); the heartbeat's, first window against last."""
    half = len(histograms) // 2
    out: dict = {}
    for key in SERVER_HISTOGRAMS:
        first = quantile_ms(summed([h[key] for h in histograms[:half]]))
        second = quantile_ms(summed([h[key] for h in histograms[half:]]))
        out[f"{key}_p99_ms_halves"] = [first, second]
        out[f"{key}_p99_second_over_first"] = _ratio(second, first)
    windows = [s for s in samples[1:] if s["heartbeat_rtt_p99_ms"] is not None]
    first_hb = windows[0]["heartbeat_rtt_p99_ms"] if windows else None
    last_hb = windows[-1]["heartbeat_rtt_p99_ms"] if windows else None
    out["heartbeat_p99_ms_first_last"] = [first_hb, last_hb]
    out["heartbeat_p99_last_over_first"] = _ratio(last_hb, first_hb)
    return out


def _refold_report(
    kind: str,
    call_s: float,
    folds: dict[str, dict],
    route: dict[str, tuple[float, int]],
    hour: dict | None,
) -> dict:
    long_id, tiny_id = list(route)
    long_fold, tiny_fold = folds[long_id], folds[tiny_id]
    scale = (SECONDS_PER_HOUR - BASELINE_S) / max(call_s - BASELINE_S, 1.0)

    def at_an_hour(long_ms: float, tiny_ms: float) -> float:
        """The line through the tiny session and the long one, at an hour:
        the estimate where the cost grows with the call, an upper bound
        where it is bounded (a restore from a snapshot)."""
        return round(tiny_ms + max(0.0, long_ms - tiny_ms) * scale, 1)

    refold: dict = {
        "call_s": call_s,
        "long_session": {
            **long_fold,
            "events_route_ms": route[long_id][0],
            "events": route[long_id][1],
        },
        "tiny_session": {
            **tiny_fold,
            "events_route_ms": route[tiny_id][0],
            "events": route[tiny_id][1],
        },
        "restore_ratio_long_over_tiny": _ratio(long_fold["restore_ms"], tiny_fold["restore_ms"]),
        "restore_ms_one_hour_extrapolated": at_an_hour(
            long_fold["restore_ms"], tiny_fold["restore_ms"]
        ),
        "events_route_ms_one_hour_extrapolated": at_an_hour(route[long_id][0], route[tiny_id][0]),
    }
    if hour is not None:
        refold["hour_session"] = {
            "call_s": hour["call_s"],
            **folds[hour["session_id"]],
            "events_route_ms": hour["events_route_ms"],
            "events": hour["events"],
        }
    if kind == "redis-media":
        refold["note"] = (
            "restore_ms reads Redis without the media directory (not on the surface): the "
            "sealed audio after the snapshot is not resolved; events_route_ms is the server's "
            "full read, archives and segments resolved"
        )
    if "full_fold_ms" in long_fold:
        refold["full_fold_ratio_long_over_tiny"] = _ratio(
            long_fold["full_fold_ms"], tiny_fold["full_fold_ms"]
        )
        refold["full_fold_ms_one_hour_extrapolated"] = at_an_hour(
            long_fold["full_fold_ms"], tiny_fold["full_fold_ms"]
        )
    return refold


def _targets(
    kind: str, slopes: dict, latency: dict, refold: dict, hour: dict | None
) -> dict[str, bool | None]:
    """The issue's targets, each None where this run could not tell."""

    def at_most(value: float | None, bound: float) -> bool | None:
        return None if value is None else value <= bound

    targets = {
        "store_append_p99_second_half_over_first_at_most_1_5": at_most(
            latency["store_append_p99_second_over_first"], TARGET_P99_LAST_OVER_FIRST
        ),
        "append_p99_second_half_over_first_at_most_1_5": at_most(
            latency["append_p99_second_over_first"], TARGET_P99_LAST_OVER_FIRST
        ),
        "restore_one_hour_under_1_s_extrapolated": refold["restore_ms_one_hour_extrapolated"]
        < TARGET_REFOLD_ONE_HOUR_MS,
    }
    measured = refold.get("hour_session")
    if measured is not None and measured["call_s"] >= SECONDS_PER_HOUR:
        targets["restore_one_hour_under_1_s_measured"] = (
            measured["restore_ms"] < TARGET_REFOLD_ONE_HOUR_MS
        )
    if kind == "redis-media":
        memory = "redis_used_memory_delta_bytes"
        slope = slopes[memory]
        targets["redis_memory_under_20_mb_per_session_hour"] = (
            None if slope is None else slope < TARGET_REDIS_MEDIA_MB_PER_SESSION_HOUR
        )
        if hour is not None:
            targets["redis_memory_under_20_mb_per_session_hour_hour_call"] = (
                hour["growth_mb_per_session_hour"][memory] < TARGET_REDIS_MEDIA_MB_PER_SESSION_HOUR
            )
    return targets


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def run(args: argparse.Namespace) -> None:
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = [s for s in stores if s not in STORES]
    if unknown or not stores:
        raise SystemExit(f"bench soak --long-calls: --stores takes {', '.join(STORES)}")
    args.long_seconds = args.seconds or DEFAULT_SECONDS
    args.long_sample_s = args.sample_s or DEFAULT_SAMPLE_S
    args.long_model = args.model
    pcm = speech_pcm24(args.speech_dir)
    with tempfile.TemporaryDirectory(prefix="duplex-long-calls-") as tmp:
        rows = [one_store(kind, pcm, args, Path(tmp) / kind) for kind in stores]
    print(
        json.dumps(
            {
                "bench": "soak",
                "mode": "long-calls",
                "cpu_count": os.cpu_count(),
                "model": args.long_model,
                "asr": args.asr if args.long_model == "cascade" else None,
                "calls": args.calls,
                "seconds": args.long_seconds,
                "sample_s": args.long_sample_s,
                "chunk_ms": CHUNK_MS,
                "speech": recorded_speech.source(),
                "valid": all(row["valid"] for row in rows),
                "invalid_reason": next(
                    (
                        f"{row['store']}: {row['invalid_reason']}"
                        for row in rows
                        if not row["valid"]
                    ),
                    None,
                ),
                "stores": rows,
            }
        )
    )
