"""``duplex-server bench batch``: what batch work costs, and whether it slows realtime speech.

One server process (the cascade; its synthesiser serves realtime and batch
speech) with an image pipeline (``--image-model``, or a random-weight one
built for the run). In the same run:

1. ``POST /v1/audio/speech`` (``stream_format=audio``), one request at a
   time: first-byte latency and real-time factor (batch_speech.py).
2. Image steps/s through ``POST /v1/images/generations`` against the same
   pipeline called directly in this process, same jobs, alternating; the
   ratio against the 5 % overhead target (batch_images.py).
3. A realtime session asks ``--turns`` text answers one after another
   (``conversation.item.create`` + ``response.create``) and times
   ``response.create`` -> the first ``response.output_audio.delta``: alone
   (the baseline), while ``--batch-clients`` clients keep
   ``POST /v1/audio/speech`` busy with long texts, and while
   ``--image-clients`` keep the image route busy. Reported: first-audio
   p50/p95/p99/max per phase and their ratios to the baseline, each
   phase's batch throughput, the server's CPU and the bench's own (the run
   is invalid when the bench's loop saturated its core).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from contextlib import ExitStack

import httpx
import psutil
import websockets

from duplex_bench.batch_images import PROMPT, ImageLoad, compare, throughput
from duplex_bench.batch_speech import ms, seconds_of, time_speech
from duplex_bench.diffusion_pipeline import ImageAsk
from duplex_bench.generator import GeneratorCpu, validity
from duplex_bench.server_process import ServerProcess

BATCH_TEXT = " ".join(
    f"Sentence {n} of a long batch text keeps the synthesiser busy for a while." for n in range(40)
)
VOICE_PARTS = {"speech", "realtime"}  # the parts that need the cascade's voice
TURN_TEXTS = ["good morning", "what time is it", "open the door", "play some music"]


async def realtime_turns(ws_url: str, turns: int) -> list[float]:
    """response.create -> first audio delta, ``turns`` times in one session."""
    latencies = []
    async with websockets.connect(ws_url, max_size=None) as ws:
        await _until(ws, "session.created")
        for turn in range(turns):
            text = TURN_TEXTS[turn % len(TURN_TEXTS)]
            item = {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            }
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            sent = time.perf_counter()
            await ws.send(json.dumps({"type": "response.create"}))
            await _until(ws, "response.output_audio.delta")
            latencies.append(time.perf_counter() - sent)
            await _until(ws, "response.done")
    return latencies


async def _until(ws: websockets.ClientConnection, kind: str) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if event["type"] == kind:
            return event
        if event["type"] == "error":
            raise RuntimeError(f"server error: {event}")


class BatchLoad:
    """Clients that keep the speech route busy until stopped."""

    def __init__(self, url: str, clients: int, response_format: str) -> None:
        self.url = url
        self.clients = clients
        self.response_format = response_format
        self.jobs = 0
        self.seconds_per_job: float | None = None
        self.failures = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _client(self) -> None:
        body = {
            "model": "tts-1",
            "voice": "alloy",
            "input": BATCH_TEXT,
            "response_format": self.response_format,
        }
        async with httpx.AsyncClient(timeout=300) as http:
            while not self._stop.is_set():
                reply = await http.post(f"{self.url}/v1/audio/speech", json=body)
                if reply.status_code != 200:
                    self.failures += 1
                    continue
                self.jobs += 1
                if self.seconds_per_job is None:  # the same text every time: measured once
                    self.seconds_per_job = await asyncio.to_thread(
                        seconds_of, reply.content, self.response_format
                    )


def run(args: argparse.Namespace) -> None:
    print(json.dumps(asyncio.run(measure(args))))


def _image_model(args: argparse.Namespace, stack: ExitStack) -> str | None:
    """``--image-model``, else a random-weight pipeline of ``--image-shape``
    built into a temporary directory (None: ``--image-shape none``)."""
    if args.image_model:
        return str(args.image_model)
    if args.image_shape == "none":
        return None
    from pathlib import Path

    from duplex_bench.diffusion_pipeline import build

    directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sd-")))
    return str(build(args.image_shape, directory / args.image_shape))


async def measure(args: argparse.Namespace) -> dict:
    """The whole run; ``load_average`` (1, 5, 15 min) at its start and end
    says how much of the machine other work had (on a shared machine it can
    move the image ratio by more than the 5 % target)."""
    began_load = _load_average()
    with ExitStack() as stack:
        image_model = _image_model(args, stack)
        # The image comparison alone needs no voice: the server then runs the
        # echo model, and loads no recogniser or synthesiser.
        voice = bool(_parts(args) & VOICE_PARTS)
        server = ServerProcess(
            args.store or "memory",
            model="cascade" if voice else "echo",
            asr="pocketsphinx" if voice else None,
            port=args.port or None,
            blob_dir=args.blob_dir,
            image_model=image_model,
        ).start()
        try:
            report = await _measure(args, server, image_model)
        finally:
            server.stop()
    report["load_average"] = {"start": began_load, "end": _load_average()}
    return report


def _parts(args: argparse.Namespace) -> set[str]:
    return set(args.parts.split(","))


def _load_average() -> list[float]:
    return [round(x, 2) for x in psutil.getloadavg()]


async def _measure(
    args: argparse.Namespace, server: ServerProcess, image_model: str | None
) -> dict:
    proc = psutil.Process(server.pid)
    ws_url = server.ws_at("/v1/realtime")
    parts = _parts(args)
    if parts & VOICE_PARTS:
        await realtime_turns(ws_url, 2)  # warm: the voice loaded, the first clause cached
    report: dict = {"bench": "batch", "turns": args.turns, "response_format": args.response_format}
    report["parts"] = sorted(parts)
    if "speech" in parts:
        report["speech"] = await time_speech(
            server.http_url, args.speech_requests, args.response_format
        )
    ask = None
    if image_model is not None and parts & {"images", "realtime"}:
        from duplex_bench.diffusion_pipeline import DirectPipeline

        direct = await asyncio.to_thread(DirectPipeline, image_model)
        side = args.image_size or direct.native_side
        ask = ImageAsk(PROMPT, side, side, args.image_steps, args.image_n, seed=1)
        if "images" in parts:
            report["images"] = await compare(
                server.http_url, direct, ask, args.image_jobs, server.pid
            )
            report["images"]["throughput"] = await throughput(
                server.http_url, direct, ask, args.image_jobs
            )
        del direct  # its memory back before the realtime phases
    if "realtime" in parts:
        report.update(await _realtime(args, server, proc, ws_url, ask))
    else:
        # The image comparison has no load generator to saturate: the bench
        # waits while the server paints and paints while the server waits.
        report.update(valid=None, invalid_reason="validity is judged in the realtime part")
    return report


async def _realtime(
    args: argparse.Namespace,
    server: ServerProcess,
    proc: psutil.Process,
    ws_url: str,
    ask: ImageAsk | None,
) -> dict:
    """First-audio alone, beside batch speech and (``ask``) beside image jobs."""
    report: dict = {}
    phases = {}
    for name, clients in (("baseline", 0), ("with_batch", args.batch_clients)):
        speech = BatchLoad(server.http_url, clients, args.response_format)
        phase, wall = await _phase(proc, ws_url, args.turns, speech)
        phases[name] = {
            **phase,
            "batch_clients": clients,
            "batch_jobs": speech.jobs,
            "batch_failures": speech.failures,
            "batch_audio_s_per_s": round(speech.jobs * (speech.seconds_per_job or 0) / wall, 2),
        }
    if ask is not None:
        images = ImageLoad(server.http_url, args.image_clients, ask)
        phase, wall = await _phase(proc, ws_url, args.turns, images)
        phases["with_images"] = {
            **phase,
            "image_clients": args.image_clients,
            "image_jobs": images.jobs,
            "image_failures": images.failures,
            "image_steps_per_s": round(images.jobs * ask.steps / wall, 3),
        }
    report.update(phases)
    base = phases["baseline"]["first_audio"]
    for name, prefix in (("with_batch", ""), ("with_images", "images_")):
        if name in phases:
            loaded = phases[name]["first_audio"]
            report[f"{prefix}p50_ratio"] = round(loaded["p50_ms"] / base["p50_ms"], 2)
            report[f"{prefix}p99_ratio"] = round(loaded["p99_ms"] / base["p99_ms"], 2)
    report.update(validity(*phases.values()))
    return report


async def _phase(
    proc: psutil.Process, ws_url: str, turns: int, load: BatchLoad | ImageLoad
) -> tuple[dict, float]:
    """Realtime turns timed while ``load`` runs (no clients: alone); the
    phase's report and its wall time."""
    generator = GeneratorCpu()
    load.start()
    if load.clients:
        await asyncio.sleep(1.0)  # the jobs are running when the turns begin
    proc.cpu_percent(None)
    generator.start()
    began = time.perf_counter()
    latencies = await realtime_turns(ws_url, turns)
    await load.stop()
    wall = time.perf_counter() - began
    phase = {
        "first_audio": ms(latencies),
        "server_cpu_percent": round(proc.cpu_percent(None), 1),
        **generator.report(),
    }
    return phase, wall
