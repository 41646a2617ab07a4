"""``duplex-server bench llm``: the AR path through the real server against
direct calls to the same backend class on the same prompts, in one run.

The model is ``--llm PATH``, or the tiny chat model trained into a temporary
directory (``tiny_llm``), whose answers to the prompts are known. Phases, one
after another so they do not share the CPU:

1. Direct: a ``TransformersBackend`` built in this process behind an
   ``EngineCore``, as the server builds it. TTFT of each prompt alone
   (request -> first delta, ``--repeats`` times; and request -> as much
   text as the server's first delta held, the like-for-like baseline: the
   responder hands text on clause by clause), then ``--sessions``
   requests at once (prompts in turn): output characters per second, and
   the mean time of one decode step (the window's steps over its time).
2. Ours: a server process with ``--llm``; text sessions over WebSockets
   (``response.create`` at temperature 0, ``output_modalities: ["text"]``):
   the same TTFT (``response.create`` sent -> first
   ``response.output_text.delta``) and the same concurrent run. Then
   abort-to-silence: every session cancels (``response.cancel``) at its
   first delta and times the last delta that still reached it.
3. Voice-to-voice: ``bench voice --phrases``'s speakers (eSpeak speech at
   real time, server VAD, phrase-grammar ASR, barge-ins) with the LLM
   answering: ``speech_stopped`` -> first answer audio, p50/p95.

Server CPU (its process) and the generator's CPU are reported per phase;
the run is invalid when the generator saturated its core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import websockets

from duplex_server.bench import tiny_llm, voice_phrases
from duplex_server.bench.generator import GeneratorCpu, validity
from duplex_server.bench.server_process import ServerProcess

TARGET_TTFT_OVERHEAD = 0.05
TARGET_THROUGHPUT_RATIO = 0.95
TARGET_ABORT_SLACK_MS = 5.0
TARGET_VOICE_P95_MS = 250.0
READY_TIMEOUT_S = 600.0


@dataclass
class Window:
    """One concurrent run: its wall time, the text produced, and TTFTs."""

    seconds: float = 0.0
    chars: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    @property
    def chars_per_s(self) -> float:
        return self.chars / self.seconds if self.seconds else 0.0


def _quantiles(values_ms: list[float], *qs: int) -> dict[str, Any]:
    if not values_ms:
        return {**{f"p{q}": None for q in qs}, "n": 0}
    values = np.array(values_ms)
    return {**{f"p{q}": round(float(np.percentile(values, q)), 2) for q in qs}, "n": len(values)}


def _ms(seconds: float) -> float:
    return seconds * 1000.0


# --- direct calls -----------------------------------------------------------


async def _direct_one(
    core: Any, prompt: str, tag: str, max_new: int, arrivals: list | None = None
) -> tuple[float, str]:
    """TTFT (request -> first delta) and the answer; ``arrivals`` gets
    (characters so far, ms since the request) of every delta."""
    from duplex_server.engine.core import EngineRequest
    from duplex_server.engine.llm import ChatPayload

    request = EngineRequest(
        request_id=tag,
        session_id=tag,
        response_id=tag,
        epoch=0,
        payload=ChatPayload(tiny_llm.chat(prompt), 0.0, max_new),
    )
    started, first, text = time.perf_counter(), None, []
    chars = 0
    async for delta in core.submit(request):
        first = first or time.perf_counter()
        text.append(delta)
        chars += len(delta)
        if arrivals is not None:
            arrivals.append((chars, _ms(time.perf_counter() - started)))
    return _ms((first or time.perf_counter()) - started), "".join(text)


async def _direct_window(core: Any, prompts: list[str], max_new: int) -> Window:
    started = time.perf_counter()
    tag = f"{started:.6f}"
    results = await asyncio.gather(
        *(_direct_one(core, p, f"c{i}-{tag}", max_new) for i, p in enumerate(prompts))
    )
    window = Window(time.perf_counter() - started)
    window.ttft_ms = [ttft for ttft, _ in results]
    window.texts = [text for _, text in results]
    window.chars = sum(map(len, window.texts))
    return window


def _direct_phase(path: Path, args: argparse.Namespace, prompts: list[str]) -> dict:
    from duplex_server.engine.core import EngineCore
    from duplex_server.engine.llm.transformers_backend import TransformersBackend

    backend = TransformersBackend(path)
    if not backend.wait_loaded(timeout=READY_TIMEOUT_S):
        raise SystemExit(f"bench llm: {backend.load_error}")
    core: EngineCore[Any, str] = EngineCore(backend, max_concurrency=512, name="bench")
    try:
        loop = asyncio.new_event_loop()
        run = loop.run_until_complete
        run(_direct_window(core, prompts, args.max_new_tokens))  # warm-up
        arrivals: dict[str, list[list]] = {p: [] for p in args.prompts}
        ttft = []
        for r in range(args.repeats):
            for i, p in enumerate(args.prompts):
                arrivals[p].append([])
                tag = f"a{r}-{i}"
                ttft.append(run(_direct_one(core, p, tag, args.max_new_tokens, arrivals[p][-1]))[0])
        steps, generator = backend.steps, GeneratorCpu()
        generator.start()
        window = run(_direct_window(core, prompts, args.max_new_tokens))
        steps = backend.steps - steps
        loop.close()
    finally:
        backend.close()
    return {
        "ttft_alone_ms": _quantiles(ttft, 50, 95),
        "ttft_alone_ms_mean": round(statistics.fmean(ttft), 2),
        "arrivals": arrivals,
        "chars_per_s": round(window.chars_per_s, 1),
        "chars": window.chars,
        "seconds": round(window.seconds, 3),
        "decode_steps": steps,
        "decode_step_ms_mean": round(_ms(window.seconds) / steps, 3) if steps else None,
        "texts": window.texts,
        # the backend's own work runs in this process: not a client loop to judge
        "bench_process_cpu_percent": generator.report()["generator_cpu_percent"],
    }


# --- through the server -----------------------------------------------------


class TextSession:
    """One WebSocket session that asks in text and reads the deltas."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, url: str) -> TextSession:
        ws = await websockets.connect(url, max_size=None)
        session = cls(ws)
        await session.until("session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
        await session.until("session.updated")
        return session

    async def until(self, *types: str) -> dict:
        while True:
            event = json.loads(await asyncio.wait_for(self.ws.recv(), 120))
            if event["type"] == "error":
                raise RuntimeError(f"bench llm: the server refused: {event}")
            if event["type"] in types:
                return event

    async def ask(self, prompt: str, cancel_at_first: bool = False) -> dict:
        """Send the prompt and ``response.create``; read up to ``response.done``."""
        content = [{"type": "input_text", "text": prompt}]
        item = {"type": "message", "role": "user", "content": content}
        await self.ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        response = {"output_modalities": ["text"], "temperature": 0.0}
        started = time.perf_counter()
        await self.ws.send(json.dumps({"type": "response.create", "response": response}))
        first = cancelled = last = None
        text = []
        while True:
            event = await self.until("response.output_text.delta", "response.done")
            now = time.perf_counter()
            if event["type"] == "response.done":
                status = event["response"]["status"]
                break
            text.append(event["delta"])
            last = now
            if first is None:
                first = now
                if cancel_at_first:
                    await self.ws.send(json.dumps({"type": "response.cancel"}))
                    cancelled = time.perf_counter()
        return {
            "ttft_ms": _ms((first or now) - started),
            "first_delta_chars": len(text[0]) if text else 0,
            "text": "".join(text),
            "status": status,
            "abort_to_silence_ms": _ms(max(0.0, last - cancelled)) if cancelled and last else None,
            "cancel_to_done_ms": _ms(now - cancelled) if cancelled else None,
        }

    async def close(self) -> None:
        await self.ws.close()


async def _server_window(sessions: list[TextSession], prompts: list[str]) -> Window:
    started = time.perf_counter()
    results = await asyncio.gather(*(s.ask(p) for s, p in zip(sessions, prompts, strict=True)))
    window = Window(time.perf_counter() - started)
    window.ttft_ms = [r["ttft_ms"] for r in results]
    window.texts = [r["text"] for r in results]
    window.chars = sum(map(len, window.texts))
    return window


async def _fresh(url: str, count: int) -> list[TextSession]:
    """New sessions: each question starts its own conversation, so the
    server's chat is the direct call's (no earlier turns in it)."""
    return list(await asyncio.gather(*(TextSession.open(url) for _ in range(count))))


async def _ask_fresh(url: str, prompts: list[str], cancel: bool = False) -> list[dict]:
    sessions = await _fresh(url, len(prompts))
    try:
        return list(
            await asyncio.gather(
                *(s.ask(p, cancel) for s, p in zip(sessions, prompts, strict=True))
            )
        )
    finally:
        await asyncio.gather(*(s.close() for s in sessions))


async def _server_measure(url: str, args: argparse.Namespace, prompts: list[str], proc) -> dict:
    await _ask_fresh(url, prompts)  # warm-up
    ttft, first_chars = [], {}
    for _ in range(args.repeats):
        for prompt in args.prompts:
            (answer,) = await _ask_fresh(url, [prompt])
            ttft.append(answer["ttft_ms"])
            first_chars[prompt] = answer["first_delta_chars"]
    sessions = await _fresh(url, len(prompts))
    try:
        generator = GeneratorCpu()
        generator.start()
        proc.cpu_percent(None)
        window = await _server_window(sessions, prompts)
        server_cpu = proc.cpu_percent(None)
        report = generator.report()
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
    aborts = await _ask_fresh(url, prompts, cancel=True)
    silences = [a["abort_to_silence_ms"] for a in aborts if a["abort_to_silence_ms"] is not None]
    done = [a["cancel_to_done_ms"] for a in aborts if a["cancel_to_done_ms"] is not None]
    return {
        "ttft_alone_ms": _quantiles(ttft, 50, 95),
        "ttft_alone_ms_mean": round(statistics.fmean(ttft), 2),
        "first_delta_chars": first_chars,
        "chars_per_s": round(window.chars_per_s, 1),
        "chars": window.chars,
        "seconds": round(window.seconds, 3),
        "texts": window.texts,
        "server_cpu_percent": round(server_cpu, 1),
        **report,
        "abort": {
            "cancels": len(aborts),
            "cancelled_mid_answer": sum(a["status"] == "cancelled" for a in aborts),
            # response.cancel sent -> the last delta that still arrived (0: none did)
            "abort_to_silence_ms": _quantiles(silences, 50, 99),
            "cancel_to_response_done_ms": _quantiles(done, 50, 99),
        },
    }


def _wait_ready(server: ServerProcess) -> None:
    """``/ready`` answers 200 once the weights are loaded (a start-up limit,
    not a measurement)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(server.http_url + "/ready", timeout=5) as reply:
                if reply.status == 200:
                    return
        except urllib.error.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"bench llm: the server was not ready in {READY_TIMEOUT_S:g} s")


def _llm_server(path: Path, sessions: int, **flags: Any) -> ServerProcess:
    server = ServerProcess(
        "memory",
        model="cascade",
        llm=path,
        llm_backend="transformers",
        max_sessions=sessions,
        **flags,
    )
    server.start(timeout_s=120.0)
    _wait_ready(server)
    return server


def _server_phase(path: Path, args: argparse.Namespace, prompts: list[str]) -> dict:
    # every question has its own session, and a closed one may still count
    # against the cap for a while: room for all of them
    server = _llm_server(path, 3 * len(prompts) + args.repeats * len(args.prompts) + 16)
    try:
        proc = psutil.Process(server.pid)
        return asyncio.run(_server_measure(server.ws_url, args, prompts, proc))
    finally:
        server.stop()


def _voice_phase(path: Path, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        phrases = Path(tmp) / "phrases.txt"
        phrases.write_text("\n".join(voice_phrases.PHRASES))
        server = _llm_server(path, args.voice_sessions + 8, asr_phrases=phrases)
        try:
            drive = argparse.Namespace(
                sessions=args.voice_sessions, turns=args.voice_turns, chunk_ms=args.chunk_ms
            )
            return asyncio.run(
                voice_phrases._drive(server.ws_url, drive, psutil.Process(server.pid))
            )
        finally:
            server.stop()


# --- the report ---------------------------------------------------------------


def _same_text_ttft(arrivals: dict[str, list[list]], first_chars: dict[str, int]) -> list[float]:
    """Direct: when each answer had as much text as the server's first delta
    (the responder hands text on clause by clause, so its first delta is a
    clause, not a token): the like-for-like TTFT baseline."""
    times = []
    for prompt, runs in arrivals.items():
        need = first_chars.get(prompt, 1)
        for run in runs:
            times.extend(next(([ms] for chars, ms in run if chars >= need), []))
    return times


def _targets(direct: dict, ours: dict, voice: dict | None) -> dict:
    overhead = ours["ttft_alone_ms"]["p50"] / direct["ttft_same_text_ms"]["p50"] - 1.0
    ratio = ours["chars_per_s"] / direct["chars_per_s"]
    step = direct["decode_step_ms_mean"]
    abort_p99 = ours["abort"]["abort_to_silence_ms"]["p99"]
    v2v = voice["vad_stopped_to_first_audio_ms"]["p95"] if voice else None
    return {
        "ttft_overhead": round(overhead, 4),
        "ttft_overhead_at_most_5_percent": overhead <= TARGET_TTFT_OVERHEAD,
        "throughput_ratio": round(ratio, 4),
        "throughput_at_least_0_95": ratio >= TARGET_THROUGHPUT_RATIO,
        "abort_limit_ms": round(step + TARGET_ABORT_SLACK_MS, 3) if step else None,
        "abort_to_silence_p99_within_one_step_plus_5ms": (
            abort_p99 is not None and step is not None and abort_p99 <= step + TARGET_ABORT_SLACK_MS
        ),
        "voice_to_voice_p95_under_250ms": v2v is not None and v2v < TARGET_VOICE_P95_MS,
    }


def measure(path: Path, args: argparse.Namespace) -> dict:
    prompts = [args.prompts[i % len(args.prompts)] for i in range(args.sessions)]
    direct = _direct_phase(path, args, prompts)
    ours = _server_phase(path, args, prompts)
    same = _same_text_ttft(direct.pop("arrivals"), ours["first_delta_chars"])
    direct["ttft_same_text_ms"] = _quantiles(same, 50, 95)
    voice = _voice_phase(path, args) if args.voice_sessions else None
    return {
        "bench": "llm",
        "model": str(args.llm) if args.llm else "tiny (trained here)",
        "backend": "transformers",
        "sessions": args.sessions,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        **validity(ours, *([voice] if voice else [])),
        "same_answers": direct.pop("texts") == ours.pop("texts"),
        "direct": direct,
        "ours": ours,
        "voice_to_voice": voice,
        "targets": _targets(direct, ours, voice),
    }


def run(args: argparse.Namespace) -> None:
    args.prompts = tiny_llm.TEXT_PROMPTS
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.llm) if args.llm else tiny_llm.build(Path(tmp) / "tiny-llm")
        print(json.dumps(measure(path, args)))
