"""``duplex-server bench duplex-model``: a native duplex model's tick through
the real server against the same batched step run directly, in one run.

Server phase: a real ``serve --model moshi:PATH --moshi-rows N`` child
process; N WebSocket sessions each send one 80 ms frame of audio every
80 ms (paced on the wall clock, as a microphone would) for ``--frames``
frames, and read everything the server sends. The tick figures come from
the server's own ``duplex_model_tick_seconds`` histogram and
``duplex_model_tick_overruns_total`` counter (read from ``/metrics`` before
and after: quantiles interpolated within buckets, as Prometheus's
``histogram_quantile`` does; the max is the upper bound of the highest
bucket hit). Direct phase: the same checkpoint and step (``--moshi-step``)
in this process, N rows ticked back to back for the same frames (exact
percentiles). Ratios are server over direct.

Without ``--model`` it serves a tiny random checkpoint built here. The
generator's CPU is this process's during the server phase (its clients on
one event loop); the run is invalid when it saturates.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import websockets

from duplex_bench.generator import GeneratorCpu, validity
from duplex_bench.server_process import ServerProcess

FRAME_SAMPLES = 1920
FRAME_S = 0.080
BUDGET_MS = 80.0
TICK_SERIES = "duplex_model_tick_seconds"
OVERRUN_SERIES = "duplex_model_tick_overruns_total"
LOAD_TIMEOUT_S = 1800.0
# After the last frame the sessions stay open until the server has ticked
# every frame sent (a slow model works off a backlog), at most this long.
DRAIN_LIMIT_S = 600.0
POLL_S = 0.5


@dataclass
class ClientFigures:
    sent: int = 0
    audio_deltas: int = 0
    errors: list[str] = field(default_factory=list)


def _frame_message(rng: np.random.Generator) -> str:
    pcm = (rng.standard_normal(FRAME_SAMPLES) * 3000).astype("<i2").tobytes()
    return json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}
    )


async def _client(
    url: str, frames: int, start: float, seed: int, drained: asyncio.Event
) -> ClientFigures:
    figures = ClientFigures()
    rng = np.random.default_rng(seed)
    async with websockets.connect(url, max_size=None) as ws:
        created = json.loads(await ws.recv())
        if created.get("type") != "session.created":
            figures.errors.append(f"first event {created.get('type')}")
            return figures
        reader = asyncio.create_task(_read(ws, figures))
        for index in range(frames):
            await asyncio.sleep(max(0.0, start + index * FRAME_S - time.monotonic()))
            await ws.send(_frame_message(rng))
            figures.sent += 1
        await drained.wait()
        reader.cancel()
    return figures


async def _read(ws: Any, figures: ClientFigures) -> None:
    async for raw in ws:
        event = json.loads(raw)
        if event.get("type") == "response.output_audio.delta":
            figures.audio_deltas += 1
        elif event.get("type") == "error":
            figures.errors.append(str(event.get("error", {}).get("code")))


def scrape(server: ServerProcess) -> dict[str, float]:
    """The tick histogram's cumulative buckets (by ``le``), its count and sum, and overruns."""
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{TICK_SERIES}_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[f"le:{le}"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith((f"{TICK_SERIES}_count", f"{TICK_SERIES}_sum", OVERRUN_SERIES)):
            out[line.split("{", 1)[0].split(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


def histogram_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Tick quantiles (ms) of the ticks between two scrapes."""
    edges = sorted(
        (float(key[3:]), after[key] - before.get(key, 0.0))
        for key in after
        if key.startswith("le:")
    )
    count = after.get(f"{TICK_SERIES}_count", 0.0) - before.get(f"{TICK_SERIES}_count", 0.0)
    total = after.get(f"{TICK_SERIES}_sum", 0.0) - before.get(f"{TICK_SERIES}_sum", 0.0)
    overruns = after.get(OVERRUN_SERIES, 0.0) - before.get(OVERRUN_SERIES, 0.0)
    hit = [edge for edge, cumulative in edges if cumulative < count]
    top = edges[len(hit)][0] if len(hit) < len(edges) else math.inf
    return {
        "ticks": int(count),
        "tick_ms_mean": round(total / count * 1000, 2) if count else None,
        "tick_ms_p50": _quantile(edges, count, 0.50),
        "tick_ms_p99": _quantile(edges, count, 0.99),
        "tick_ms_max_bucket": None if math.isinf(top) else round(top * 1000, 2),
        "underruns": int(overruns),
    }


def _quantile(edges: list[tuple[float, float]], count: float, q: float) -> float | None:
    if not count:
        return None
    rank, lower, below = q * count, 0.0, 0.0
    for edge, cumulative in edges:
        if cumulative >= rank:
            if math.isinf(edge):
                return round(lower * 1000, 2)
            share = (rank - below) / (cumulative - below) if cumulative > below else 1.0
            return round((lower + (edge - lower) * share) * 1000, 2)
        lower, below = edge, cumulative
    return None


def server_phase(args: argparse.Namespace, checkpoint: Path) -> dict[str, Any]:
    server = ServerProcess(
        model=f"moshi:{checkpoint}",
        moshi_rows=args.sessions,
        moshi_step=args.moshi_step,
        device=args.device,
        dtype=args.dtype,
    ).start()
    try:
        _wait_ready(server)
        before = scrape(server)
        cpu = GeneratorCpu()
        cpu.start()
        clients, seconds = asyncio.run(_clients(server, args, before))
        generator = cpu.report()
        figures = histogram_figures(before, scrape(server))
    finally:
        server.stop()
    errors = [error for client in clients for error in client.errors]
    figures["frames_per_s"] = round(figures["ticks"] * args.sessions / seconds, 1)
    return {
        **figures,
        "frames_sent": sum(client.sent for client in clients),
        "audio_deltas_received": sum(client.audio_deltas for client in clients),
        "client_errors": errors[:10],
        **generator,
    }


async def _clients(
    server: ServerProcess, args: argparse.Namespace, before: dict[str, float]
) -> tuple[list[ClientFigures], float]:
    """The sessions' figures, and the seconds from the first frame until the
    server had ticked as many times as frames were sent."""
    start = time.monotonic() + 1.0  # every session open before the first frame
    drained = asyncio.Event()
    sessions = [
        _client(server.ws_url, args.frames, start, seed, drained) for seed in range(args.sessions)
    ]
    watcher = asyncio.create_task(_drain(server, before, args.frames, start))
    try:
        clients = await asyncio.gather(*sessions, _release(watcher, drained))
    finally:
        watcher.cancel()
    return list(clients[:-1]), time.monotonic() - start  # type: ignore[arg-type]


async def _drain(
    server: ServerProcess, before: dict[str, float], frames: int, start: float
) -> float:
    """Poll ``/metrics`` until the server has ticked ``frames`` times (or the limit)."""
    key = f"{TICK_SERIES}_count"
    deadline = start + frames * FRAME_S + DRAIN_LIMIT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        after = await asyncio.to_thread(scrape, server)
        if after.get(key, 0.0) - before.get(key, 0.0) >= frames:
            break
    return time.monotonic()


async def _release(watcher: asyncio.Task[float], drained: asyncio.Event) -> None:
    await watcher
    drained.set()


def _wait_ready(server: ServerProcess) -> None:
    """``/ready`` answers 200 once the model's weights are loaded."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(server.http_url + "/ready", timeout=5):
                return
        except OSError:  # 503 until loaded
            time.sleep(0.5)
    raise SystemExit(f"bench duplex-model: the model did not load:\n{server.log_text()[-2000:]}")


def direct_phase(args: argparse.Namespace, checkpoint: Path) -> dict[str, Any]:
    # Imported here: the server phase needs none of torch in this process.
    from duplex_server.surface import check_moshi_checkpoint, load_moshi, make_stepper, measure

    model = load_moshi(check_moshi_checkpoint(str(checkpoint)), args.device, args.dtype)
    figures = measure(
        make_stepper(model, args.sessions, args.moshi_step), args.frames, args.context
    )
    figures["underruns"] = figures.pop("over_budget_ticks")
    return figures


def _ratio(server: float | None, direct: float | None) -> float | None:
    return round(server / direct, 3) if server is not None and direct else None


def measure_both(args: argparse.Namespace, checkpoint: Path) -> dict[str, Any]:
    load_before = os.getloadavg()
    server = server_phase(args, checkpoint)
    direct = direct_phase(args, checkpoint)
    return {
        "bench": "duplex-model",
        "model": str(args.model or "tiny random"),
        "sessions": args.sessions,
        "frames": args.frames,
        "moshi_step": args.moshi_step,
        "device": args.device,
        "dtype": args.dtype,
        "server": server,
        "direct": direct,
        "ratios": {
            "tick_p50": _ratio(server["tick_ms_p50"], direct["tick_ms_p50"]),
            "tick_p99": _ratio(server["tick_ms_p99"], direct["tick_ms_p99"]),
            "frames_per_s": _ratio(server["frames_per_s"], direct["frames_per_s"]),
        },
        "load_average": {"start": load_before, "end": os.getloadavg()},
        **validity(server),
    }


def run(args: argparse.Namespace) -> None:
    if args.model:
        print(json.dumps(measure_both(args, Path(args.model))))
        return
    from duplex_bench.tiny_moshi import tiny_moshi

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(measure_both(args, tiny_moshi(Path(tmp), tokenizer=False))))
