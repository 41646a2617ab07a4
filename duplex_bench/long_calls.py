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
- the append path's latency over time: the protocol has no ack per append,
  so a heartbeat round trip each second on every session
  (``session.heartbeat`` -> ``session.heartbeat_ack``, behind the appends
  on the same socket); p99 per sample window, last window against first.

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
    initial_state,
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
) -> tuple[list[dict], Probe]:
    """The long calls, sampled every ``--sample-s`` until they end."""
    probe = Probe()
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
            sample = {
                "t_s": round(time.monotonic() - began, 1),
                **await meter.sample(),
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
    return samples, probe


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


async def _live(
    server: ServerProcess, meter: StoreMeter, pcm: bytes, args: argparse.Namespace, kind: str
) -> tuple[list[dict], Probe, dict, dict]:
    """The long calls, then the tiny one; the store at the end; the events
    route's read of each."""
    try:
        samples, probe = await talk(server, meter, pcm, args, kind)
        long_id = probe.session_ids[0]
        tiny_id = await tiny_call(server, pcm, args)
        await asyncio.sleep(SETTLE_S)  # the last appends land (and, with --media-dir, seal)
        final = await meter.sample()
    finally:
        await meter.close()
    route = {
        sid: await asyncio.to_thread(events_route_ms, server, sid) for sid in (long_id, tiny_id)
    }
    return samples, probe, final, route


async def _refold_both(
    log: RedisLog | SqliteLog, long_id: str, tiny_id: str, args: argparse.Namespace, full: bool
) -> tuple[dict, dict]:
    try:
        return (
            await refolds(log, long_id, args.long_model, full),
            await refolds(log, tiny_id, args.long_model, full),
        )
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
            samples, probe, final, route = asyncio.run(_live(server, meter, pcm, args, kind))
            long_id, tiny_id = list(route)
        finally:
            server.stop()
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
        long_fold, tiny_fold = asyncio.run(_refold_both(log, long_id, tiny_id, args, full))
    finally:
        if redis is not None:
            redis.stop()
    return _store_report(kind, args, samples, probe, final, media, route, long_fold, tiny_fold)


def _store_report(
    kind: str,
    args: argparse.Namespace,
    samples: list[dict],
    probe: Probe,
    final: dict,
    media: Path | None,
    route: dict,
    long_fold: dict,
    tiny_fold: dict,
) -> dict:
    long_id, tiny_id = list(route)
    windows = [s for s in samples[1:] if s["heartbeat_rtt_p99_ms"] is not None]
    first = windows[0]["heartbeat_rtt_p99_ms"] if windows else None
    last = windows[-1]["heartbeat_rtt_p99_ms"] if windows else None
    keys = [
        k
        for k in ("redis_used_memory_delta_bytes", "sqlite_bytes", "media_dir_bytes")
        if k in final
    ]
    slopes = {k: slope_mb_per_session_hour(samples, k, args.calls) for k in keys}
    call_s = args.long_seconds
    scale = (SECONDS_PER_HOUR - BASELINE_S) / max(call_s - BASELINE_S, 1.0)

    def hour(long_ms: float, tiny_ms: float) -> float:
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
        "restore_ms_one_hour_extrapolated": hour(long_fold["restore_ms"], tiny_fold["restore_ms"]),
        "one_hour": "not measured at one hour: extrapolated linearly from the tiny session"
        if call_s < SECONDS_PER_HOUR
        else "measured",
    }
    refold["events_route_ms_one_hour_extrapolated"] = hour(route[long_id][0], route[tiny_id][0])
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
        refold["full_fold_ms_one_hour_extrapolated"] = hour(
            long_fold["full_fold_ms"], tiny_fold["full_fold_ms"]
        )
    memory_key = "redis_used_memory_delta_bytes" if kind.startswith("redis") else "sqlite_bytes"
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
        "heartbeat_p99_ms_first_last": [first, last],
        "heartbeat_p99_last_over_first": _ratio(last, first),
        "refold": refold,
        "media_dir_files": sum(len(f) for _r, _d, f in os.walk(media)) if media else None,
        "samples": samples,
    }
    ratio = report["heartbeat_p99_last_over_first"]
    report["targets"] = {
        "heartbeat_p99_last_over_first_at_most_1_5": None
        if ratio is None
        else ratio <= TARGET_P99_LAST_OVER_FIRST,
        "restore_one_hour_under_1_s_extrapolated": refold["restore_ms_one_hour_extrapolated"]
        < TARGET_REFOLD_ONE_HOUR_MS,
    }
    if kind == "redis-media":
        slope = slopes[memory_key]
        report["targets"]["redis_memory_under_20_mb_per_session_hour"] = (
            None if slope is None else slope < TARGET_REDIS_MEDIA_MB_PER_SESSION_HOUR
        )
    return report


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
