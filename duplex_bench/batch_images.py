"""``bench batch``'s image parts: steps/s through ``POST /v1/images/generations``
against the same pipeline called directly, and clients that keep the route
busy while realtime answers are timed.

Two comparisons, each against the 5 % target. ``compare``: one job at a
time on each side, where each job's fixed cost (PNG encoding, which the
direct call does not do, HTTP, records) adds to its time: about 6 ms at
128 px and 40 ms at 512 px of random-weight noise (an incompressible
picture; a photograph encodes in half that). ``throughput``: steps/s with
the route kept busy (two clients, so a job is queued while one paints and
a finished job's encoding overlaps the next one's denoising) against the
pipeline called back to back: the rate the server sustains where the
encoding has a core of its own (a GPU's host); on two CPU cores it takes
one from the pipeline's threads instead. The direct side always paints on
one thread of its own, as the server's engine does (``DirectPipeline.
painted``).

``compare`` alternates one job on each side (after one warm-up job
each), so a neighbour's load on a shared machine falls on both; the server
is otherwise idle while the bench paints and the bench only waits while the
server paints. Each pair asks the same prompt, size, steps, n and seed, and
the pictures the server returns are compared with the bench's: the largest
pixel difference says it was the same computation (0 on one device; a
rounding step at most when thread counts differ).

Beside wall time, each job's CPU time: the server process's over the
request, the bench process's over the direct call. On a machine shared
with other work the wall-time ratio moves by more than the 5 % target from
run to run (a neighbour's load falls on one job and not the next), while
CPU seconds count only the work each side did, so their ratio says what
the route adds (HTTP, the job's records, encoding, thread hops) even when
the wall clock cannot."""

from __future__ import annotations

import asyncio
import base64
import io
import statistics
import time

import httpx
import numpy as np
import numpy.typing as npt
import psutil

from duplex_bench.diffusion_pipeline import DirectPipeline, ImageAsk

ROUTE = "/v1/images/generations"
OVERHEAD_TARGET_PERCENT = 5.0
BUSY_CLIENTS = 2  # one job painting, the next queued
PROMPT = "a lighthouse"  # within the tiny tokenizer's 16 characters


def body(ask: ImageAsk) -> dict:
    return {
        "prompt": ask.prompt,
        "n": ask.n,
        "size": f"{ask.width}x{ask.height}",
        "seed": ask.seed,
        "num_inference_steps": ask.steps,
        "response_format": "b64_json",
    }


async def _served(
    http: httpx.AsyncClient, url: str, ask: ImageAsk, decode: bool = True
) -> tuple[float, list]:
    """Seconds from request to the whole response, and its pictures (none
    unless ``decode``)."""
    began = time.perf_counter()
    reply = await http.post(url + ROUTE, json=body(ask))
    seconds = time.perf_counter() - began
    reply.raise_for_status()
    if not decode:
        return seconds, []
    pictures = [_pixels(item["b64_json"]) for item in reply.json()["data"]]
    return seconds, pictures


def _pixels(b64: str) -> npt.NDArray[np.uint8]:
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(b64))) as image:
        return np.asarray(image.convert("RGB"))


def _max_difference(a: list, b: list) -> int:
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return 255
    return max(int(np.abs(x.astype(np.int16) - y).max()) for x, y in zip(a, b, strict=True))


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _nth(ask: ImageAsk, job: int) -> ImageAsk:
    return ImageAsk(ask.prompt, ask.width, ask.height, ask.steps, ask.n, ask.seed + job)


async def _drain(http: httpx.AsyncClient, url: str, ask: ImageAsk, queue: list[int]) -> None:
    """One client: the route's jobs from ``queue`` until it is empty."""
    while queue:
        await _served(http, url, _nth(ask, queue.pop()), decode=False)


async def throughput(url: str, direct: DirectPipeline, ask: ImageAsk, jobs: int) -> dict:
    """Steps/s with the route kept busy (``BUSY_CLIENTS`` clients sharing
    ``jobs`` jobs: the next job is queued while one paints, and a finished
    one's encoding overlaps the next one's denoising) against the direct
    pipeline called back to back; two rounds of each, alternating. This is
    the rate a server sustains; ``compare``'s one job at a time adds each
    job's fixed cost (PNG, HTTP, records) to its time instead."""
    served_s = direct_s = 0.0
    async with httpx.AsyncClient(timeout=600) as http:
        for round_ in range(2):
            numbers = [round_ * jobs + job for job in range(jobs)]
            began = time.perf_counter()
            for job in numbers:
                await direct.painted(_nth(ask, job))
            direct_s += time.perf_counter() - began
            queue = list(numbers)
            began = time.perf_counter()
            await asyncio.gather(*(_drain(http, url, ask, queue) for _ in range(BUSY_CLIENTS)))
            served_s += time.perf_counter() - began
    steps = 2 * jobs * ask.steps
    ratio = (steps / served_s) / (steps / direct_s)
    overhead = (1.0 - ratio) * 100.0
    return {
        "jobs_per_side": 2 * jobs,
        "clients": BUSY_CLIENTS,
        "server_steps_per_s": round(steps / served_s, 3),
        "direct_steps_per_s": round(steps / direct_s, 3),
        "ratio": round(ratio, 3),
        "overhead_percent": round(overhead, 1),
        "overhead_target_percent": OVERHEAD_TARGET_PERCENT,
        "overhead_target_met": overhead <= OVERHEAD_TARGET_PERCENT,
    }


async def compare(
    url: str, direct: DirectPipeline, ask: ImageAsk, jobs: int, server_pid: int
) -> dict:
    """``jobs`` jobs on each side, one at a time, alternating; steps/s and
    their ratio (each job's fixed cost included), and CPU seconds a job on
    each side."""
    served_s: list[float] = []
    direct_s: list[float] = []
    served_cpu: list[float] = []
    direct_cpu: list[float] = []
    server, bench = psutil.Process(server_pid), psutil.Process()
    difference = 0
    async with httpx.AsyncClient(timeout=600) as http:
        await _served(http, url, ask)  # warm: the first call's lazy set-up
        await direct.painted(ask)
        for job in range(jobs):
            same = _nth(ask, job)
            began = _cpu_s(server)
            seconds, theirs = await _served(http, url, same)
            served_cpu.append(_cpu_s(server) - began)
            served_s.append(seconds)
            began = _cpu_s(bench)
            seconds, ours = await direct.painted(same)
            direct_cpu.append(_cpu_s(bench) - began)
            direct_s.append(seconds)
            difference = max(difference, _max_difference(theirs, ours))
    server = _side(served_s, ask)
    baseline = _side(direct_s, ask)
    ratio = server["steps_per_s"] / baseline["steps_per_s"]
    overhead = (1.0 - ratio) * 100.0
    return {
        "size": f"{ask.width}x{ask.height}",
        "steps": ask.steps,
        "n": ask.n,
        "jobs_per_side": jobs,
        "server": server,
        "direct": baseline,
        "ratio": round(ratio, 3),
        # Each side's fastest job: the least disturbed by a neighbour's load.
        "fastest_ratio": round(min(direct_s) / min(served_s), 3),
        "overhead_percent": round(overhead, 1),
        "overhead_target_percent": OVERHEAD_TARGET_PERCENT,
        "overhead_target_met": overhead <= OVERHEAD_TARGET_PERCENT,
        # CPU seconds a job (median): the server process's against the bench's direct call.
        "server_cpu_s_per_job": round(statistics.median(served_cpu), 4),
        "direct_cpu_s_per_job": round(statistics.median(direct_cpu), 4),
        "cpu_overhead_percent": round(
            (statistics.median(served_cpu) / statistics.median(direct_cpu) - 1.0) * 100.0, 1
        ),
        "max_pixel_difference": difference,
    }


def _side(seconds: list[float], ask: ImageAsk) -> dict:
    """Steps/s over the side's jobs (all their steps over all their time;
    one step paints all n pictures) and the median job."""
    return {
        "steps_per_s": round(len(seconds) * ask.steps / sum(seconds), 3),
        "median_job_s": round(statistics.median(seconds), 4),
        "min_job_s": round(min(seconds), 4),
    }


class ImageLoad:
    """Clients that keep the image route busy until stopped (the engine
    paints one job at a time; a second client keeps the next one queued)."""

    def __init__(self, url: str, clients: int, ask: ImageAsk) -> None:
        self.url = url
        self.clients = clients
        self.ask = ask
        self.jobs = 0
        self.failures = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _client(self) -> None:
        async with httpx.AsyncClient(timeout=600) as http:
            while not self._stop.is_set():
                reply = await http.post(self.url + ROUTE, json=body(self.ask))
                if reply.status_code == 200:
                    self.jobs += 1
                else:
                    self.failures += 1
                    await asyncio.sleep(0.1)  # a refusal answers at once: no spinning on it
