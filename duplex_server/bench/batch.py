"""``duplex-server bench batch``: does batch speech slow realtime speech?

One server process (the cascade; its synthesiser serves both). Two phases
in the same run: a realtime session asks ``--turns`` text answers one after
another (``conversation.item.create`` + ``response.create``) and times
``response.create`` -> the first ``response.output_audio.delta`` — first
alone (the baseline), then while ``--batch-clients`` clients keep
``POST /v1/audio/speech`` busy with long texts. Reported: first-audio
p50/p95/p99/max in both phases and their ratio, the batch phase's speech
throughput (jobs, audio seconds per wall second), the server's CPU and the
bench's own (the run is invalid when the bench's loop saturated its core).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
import numpy as np
import psutil
import websockets

from duplex_server.bench.generator import GeneratorCpu, validity
from duplex_server.bench.server_process import ServerProcess

BATCH_TEXT = " ".join(
    f"Sentence {n} of a long batch text keeps the synthesiser busy for a while." for n in range(40)
)
TURN_TEXTS = ["good morning", "what time is it", "open the door", "play some music"]


def _ms(values: list[float]) -> dict[str, float | int]:
    data = np.array(values) * 1000
    return {
        "count": len(values),
        "p50_ms": round(float(np.percentile(data, 50)), 1),
        "p95_ms": round(float(np.percentile(data, 95)), 1),
        "p99_ms": round(float(np.percentile(data, 99)), 1),
        "max_ms": round(float(data.max()), 1),
    }


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

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        self.clients = clients
        self.jobs = 0
        self.audio_s = 0.0
        self.failures = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _client(self) -> None:
        body = {"model": "tts-1", "voice": "alloy", "input": BATCH_TEXT, "response_format": "pcm"}
        async with httpx.AsyncClient(timeout=300) as http:
            while not self._stop.is_set():
                reply = await http.post(f"{self.url}/v1/audio/speech", json=body)
                if reply.status_code != 200:
                    self.failures += 1
                    continue
                self.jobs += 1
                self.audio_s += len(reply.content) / 2 / 24_000


def run(args: argparse.Namespace) -> None:
    print(json.dumps(asyncio.run(measure(args))))


async def measure(args: argparse.Namespace) -> dict:
    store = args.store or "memory"
    server = ServerProcess(
        store, model="cascade", asr="pocketsphinx", port=args.port or None, blob_dir=args.blob_dir
    ).start()
    try:
        proc = psutil.Process(server.pid)
        ws_url = server.ws_at("/v1/realtime")
        await realtime_turns(ws_url, 2)  # warm: the voice loaded, the first clause cached
        phases = {}
        for name, clients in (("baseline", 0), ("with_batch", args.batch_clients)):
            generator = GeneratorCpu()
            load = BatchLoad(server.http_url, clients)
            load.start()
            if clients:
                await asyncio.sleep(1.0)  # the jobs are running when the turns begin
            proc.cpu_percent(None)
            generator.start()
            began = time.perf_counter()
            latencies = await realtime_turns(ws_url, args.turns)
            await load.stop()
            wall = time.perf_counter() - began
            phases[name] = {
                "first_audio": _ms(latencies),
                "batch_clients": clients,
                "batch_jobs": load.jobs,
                "batch_failures": load.failures,
                "batch_audio_s_per_s": round(load.audio_s / wall, 2),
                "server_cpu_percent": round(proc.cpu_percent(None), 1),
                **generator.report(),
            }
    finally:
        server.stop()
    base, loaded = phases["baseline"]["first_audio"], phases["with_batch"]["first_audio"]
    return {
        "bench": "batch",
        "turns": args.turns,
        **phases,
        "p50_ratio": round(loaded["p50_ms"] / base["p50_ms"], 2),
        "p99_ratio": round(loaded["p99_ms"] / base["p99_ms"], 2),
        **validity(phases["baseline"], phases["with_batch"]),
    }
