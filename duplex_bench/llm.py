"""``duplex-server bench llm``: the AR path through the real server against
direct calls to the same engine on the same prompts, in one run.

The model is ``--llm PATH``, or the tiny chat model trained into a temporary
directory (``tiny_llm``), whose answers to the prompts are known. The engine
is ``--llm-backend``: ``transformers`` or ``vllm``; both sides run it with
the same options (``llm_options``), and both are up for the whole text
phase, measured turn about so that the shared machine's load falls on both
alike:

- Direct (``llm_direct``): a ``TransformersBackend`` behind an
  ``EngineCore``, as the server builds it, or vLLM's ``AsyncLLM`` called
  directly, in this process.
- Ours: a server process with ``--llm``; text sessions over WebSockets
  (``response.create`` at temperature 0, ``output_modalities: ["text"]``),
  each question in a fresh session.

TTFT of each prompt alone (direct: request -> first delta; ours:
``response.create`` sent -> first ``response.output_text.delta``),
``--repeats`` times, each direct sample followed by the server's; then
``ROUNDS`` concurrent windows of ``--sessions`` requests (prompts in turn)
on each side, alternating: output characters per second over all of a
side's windows, and the time of one decode step (transformers: the
windows' forwards over their time; vLLM: the median gap between an
answer's deltas). The direct time to as much text as the server's first
delta held is reported too: the server streams text as it decodes, so it
is the direct first token's time again (a check that the first delta is
one token's text, not a clause's). Then abort-to-silence: every session
cancels (``response.cancel``) at its first delta and times the last delta
that still reached it. Last, voice-to-voice on the same server:
``bench voice --phrases``'s speakers (eSpeak speech at real time, server
VAD, phrase-grammar ASR, barge-ins) with the LLM answering:
``speech_stopped`` -> first answer audio, p50/p95, and where that time
went (the answers' stage metrics and the client's timeline).

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

from duplex_bench import tiny_llm, voice_phrases
from duplex_bench.generator import GeneratorCpu, validity
from duplex_bench.llm_direct import open_direct
from duplex_bench.server_process import ServerProcess
from duplex_server.surface import LLMOptions

TARGET_TTFT_OVERHEAD = 0.05
TARGET_THROUGHPUT_RATIO = 0.95
TARGET_ABORT_SLACK_MS = 5.0
TARGET_VOICE_P95_MS = 250.0
READY_TIMEOUT_S = 600.0
ROUNDS = 3  # concurrent windows of each side, turn about


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
    direct: Any, prompt: str, tag: str, max_new: int, arrivals: list | None = None
) -> tuple[float, str]:
    """TTFT (request -> first delta) and the answer; ``arrivals`` gets
    (characters so far, ms since the request) of every delta."""
    started, first, text = time.perf_counter(), None, []
    chars = 0
    async for delta in direct.stream(prompt, tag, max_new):
        first = first or time.perf_counter()
        text.append(delta)
        chars += len(delta)
        if arrivals is not None:
            arrivals.append((chars, _ms(time.perf_counter() - started)))
    return _ms((first or time.perf_counter()) - started), "".join(text)


async def _direct_window(direct: Any, prompts: list[str], max_new: int) -> tuple[Window, list]:
    """Every prompt at once; the window and each answer's arrivals."""
    started = time.perf_counter()
    tag = f"{started:.6f}"
    arrivals: list[list] = [[] for _ in prompts]
    results = await asyncio.gather(
        *(
            _direct_one(direct, p, f"c{i}-{tag}", max_new, arrivals[i])
            for i, p in enumerate(prompts)
        )
    )
    window = Window(time.perf_counter() - started)
    window.ttft_ms = [ttft for ttft, _ in results]
    window.texts = [text for _, text in results]
    window.chars = sum(map(len, window.texts))
    return window, arrivals


def _gaps_ms(arrivals: list[list]) -> list[float]:
    """The gaps between one answer's consecutive deltas, over all answers:
    with every answer in one batch, each gap is about one decode step."""
    return [b[1] - a[1] for run in arrivals for a, b in zip(run, run[1:], strict=False)]


def llm_options(path: Path, args: argparse.Namespace) -> LLMOptions:
    """What both sides run: the server gets the same as ``--llm-*`` flags."""
    if args.llm_backend == "vllm":
        # float32 as the tiny model was trained; eager: no torch.compile
        return LLMOptions(
            str(path),
            backend="vllm",
            dtype="float32",
            kv_cache_bytes=args.kv_cache_bytes,
            enforce_eager=True,
        )
    return LLMOptions(str(path), backend="transformers")


def _server_flags(options: LLMOptions) -> tuple[list[str], dict[str, Any]]:
    flags: dict[str, Any] = {
        "llm_backend": options.backend,
        "llm_dtype": options.dtype,
        "llm_max_num_seqs": options.max_num_seqs,
        "llm_kv_cache_bytes": options.kv_cache_bytes,
    }
    return (["--llm-enforce-eager"] if options.enforce_eager else []), flags


async def _direct_ttft(direct: Any, args: argparse.Namespace, r: int, i: int, arrivals) -> float:
    prompt = args.prompts[i]
    arrivals[prompt].append([])
    one = _direct_one(direct, prompt, f"a{r}-{i}", args.max_new_tokens, arrivals[prompt][-1])
    return (await one)[0]


async def _direct_round(direct: Any, prompts: list[str], max_new: int, into: dict) -> None:
    """One concurrent window of direct calls, added to ``into``."""
    steps, generator = direct.steps, GeneratorCpu()
    generator.start()
    window, runs = await _direct_window(direct, prompts, max_new)
    if steps is not None and direct.steps is not None:
        into["steps"] = into.get("steps", 0) + direct.steps - steps
    into.setdefault("windows", []).append(window)
    into.setdefault("gaps", []).extend(_gaps_ms(runs))
    into.setdefault("cpu", []).append(generator.report()["generator_cpu_percent"])


def _direct_report(ttft: list[float], arrivals: dict, rounds: dict) -> dict:
    windows: list[Window] = rounds["windows"]
    seconds = sum(w.seconds for w in windows)
    chars = sum(w.chars for w in windows)
    steps, gaps = rounds.get("steps"), rounds["gaps"]
    return {
        "ttft_alone_ms": _quantiles(ttft, 50, 95),
        "ttft_alone_ms_mean": round(statistics.fmean(ttft), 2),
        "arrivals": arrivals,
        "chars_per_s": round(chars / seconds, 1),
        "chars": windows[-1].chars,
        "seconds": round(seconds, 3),
        "decode_steps": steps,
        # the windows' forwards over their time (transformers, which counts
        # them); else the deltas' median gap in the windows, one batch step
        "decode_step_ms_mean": (
            round(_ms(seconds) / steps, 3)
            if steps
            else round(statistics.median(gaps), 3)
            if gaps
            else None
        ),
        "delta_gap_ms": _quantiles(gaps, 50, 95),
        "texts": windows[-1].texts,
        # the backend's own work runs in this process: not a client loop to judge
        "bench_process_cpu_percent": max(rounds["cpu"]),
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


async def _server_round(url: str, prompts: list[str], proc, into: dict) -> None:
    """One concurrent window through the server, added to ``into``."""
    sessions = await _fresh(url, len(prompts))
    try:
        generator = GeneratorCpu()
        generator.start()
        proc.cpu_percent(None)
        window = await _server_window(sessions, prompts)
        into.setdefault("server_cpu", []).append(proc.cpu_percent(None))
        into.setdefault("reports", []).append(generator.report())
        into.setdefault("windows", []).append(window)
    finally:
        await asyncio.gather(*(s.close() for s in sessions))


def _server_report(ttft: list[float], first_chars: dict, rounds: dict, aborts: list) -> dict:
    windows: list[Window] = rounds["windows"]
    seconds = sum(w.seconds for w in windows)
    silences = [a["abort_to_silence_ms"] for a in aborts if a["abort_to_silence_ms"] is not None]
    done = [a["cancel_to_done_ms"] for a in aborts if a["cancel_to_done_ms"] is not None]
    busiest = max(rounds["reports"], key=lambda r: r["generator_cpu_percent"])
    return {
        "ttft_alone_ms": _quantiles(ttft, 50, 95),
        "ttft_alone_ms_mean": round(statistics.fmean(ttft), 2),
        "first_delta_chars": first_chars,
        "chars_per_s": round(sum(w.chars for w in windows) / seconds, 1),
        "chars": windows[-1].chars,
        "seconds": round(seconds, 3),
        "texts": windows[-1].texts,
        "server_cpu_percent": round(statistics.fmean(rounds["server_cpu"]), 1),
        **busiest,
        "abort": {
            "cancels": len(aborts),
            "cancelled_mid_answer": sum(a["status"] == "cancelled" for a in aborts),
            # response.cancel sent -> the last delta that still arrived (0: none did)
            "abort_to_silence_ms": _quantiles(silences, 50, 99),
            "cancel_to_response_done_ms": _quantiles(done, 50, 99),
        },
    }


async def _interleaved(
    direct: Any, url: str, args: argparse.Namespace, prompts: list[str], proc
) -> tuple[dict, dict]:
    """Both sides, turn about: each TTFT sample of one is followed by the
    same prompt on the other, each concurrent window of one by the other's
    (``ROUNDS`` of each), so the shared machine's load falls on both alike."""
    await _direct_window(direct, prompts, args.max_new_tokens)  # warm-up
    await _ask_fresh(url, prompts)
    arrivals: dict[str, list[list]] = {p: [] for p in args.prompts}
    direct_ttft, ours_ttft, first_chars = [], [], {}
    for r in range(args.repeats):
        for i, prompt in enumerate(args.prompts):
            direct_ttft.append(await _direct_ttft(direct, args, r, i, arrivals))
            (answer,) = await _ask_fresh(url, [prompt])
            ours_ttft.append(answer["ttft_ms"])
            first_chars[prompt] = answer["first_delta_chars"]
    direct_rounds: dict = {}
    ours_rounds: dict = {}
    for _ in range(ROUNDS):
        await _direct_round(direct, prompts, args.max_new_tokens, direct_rounds)
        await _server_round(url, prompts, proc, ours_rounds)
    aborts = await _ask_fresh(url, prompts, cancel=True)
    return (
        _direct_report(direct_ttft, arrivals, direct_rounds),
        _server_report(ours_ttft, first_chars, ours_rounds, aborts),
    )


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


def _llm_server(options: LLMOptions, sessions: int, **flags: Any) -> ServerProcess:
    extra, llm_flags = _server_flags(options)
    server = ServerProcess(
        "memory",
        *extra,
        model="cascade",
        llm=options.path,
        max_sessions=sessions,
        **llm_flags,
        **flags,
    )
    server.start(timeout_s=120.0)
    _wait_ready(server)
    return server


def _both_sides(path: Path, args: argparse.Namespace, prompts: list[str]) -> tuple:
    """The server (up first: vLLM's start is long) and the direct engine,
    both loaded for the whole text phase; then the voice phase on the same
    server (its phrase-grammar recogniser is set from the start)."""
    options = llm_options(path, args)
    # every question has its own session, and a closed one may still count
    # against the cap for a while: room for all of them
    sessions = (ROUNDS + 2) * len(prompts) + args.repeats * len(args.prompts) + 16
    sessions += args.voice_sessions
    with tempfile.TemporaryDirectory() as tmp:
        phrases = Path(tmp) / "phrases.txt"
        phrases.write_text("\n".join(voice_phrases.PHRASES))
        server = _llm_server(options, sessions, asr_phrases=phrases)
        try:
            proc = psutil.Process(server.pid)
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)  # vLLM's engine is built on it
            try:
                direct = open_direct(options)
                try:
                    text = _interleaved(direct, server.ws_url, args, prompts, proc)
                    direct_report, ours = loop.run_until_complete(text)
                finally:
                    direct.close()
            finally:
                loop.close()
                asyncio.set_event_loop(None)
            voice = asyncio.run(_voice(server.ws_url, args, proc)) if args.voice_sessions else None
        finally:
            server.stop()
    return direct_report, ours, voice


async def _voice(url: str, args: argparse.Namespace, proc) -> dict:
    drive = argparse.Namespace(
        sessions=args.voice_sessions, turns=args.voice_turns, chunk_ms=args.chunk_ms
    )
    return await voice_phrases._drive(url, drive, proc)


# --- the report ---------------------------------------------------------------


def _same_text_ttft(arrivals: dict[str, list[list]], first_chars: dict[str, int]) -> list[float]:
    """Direct: when each answer had as much text as the server's first delta
    held. The server streams text as it decodes, so this is the direct first
    token's time again; reported as a check that the server's first delta
    is one token's text, not a clause's."""
    times = []
    for prompt, runs in arrivals.items():
        need = first_chars.get(prompt, 1)
        for run in runs:
            times.extend(next(([ms] for chars, ms in run if chars >= need), []))
    return times


def _targets(direct: dict, ours: dict, voice: dict | None) -> dict:
    # the server's first text delta against the direct first token
    overhead = ours["ttft_alone_ms"]["p50"] / direct["ttft_alone_ms"]["p50"] - 1.0
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
    load_before = [round(x, 2) for x in os.getloadavg()]
    direct, ours, voice = _both_sides(path, args, prompts)
    same = _same_text_ttft(direct.pop("arrivals"), ours["first_delta_chars"])
    direct["ttft_same_text_ms"] = _quantiles(same, 50, 95)
    return {
        "bench": "llm",
        "model": str(args.llm) if args.llm else "tiny (trained here)",
        "backend": args.llm_backend,
        "sessions": args.sessions,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "rounds": ROUNDS,
        # the 1, 5 and 15 minute load averages at the end, and at the start
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "load_average_start": load_before,
        **validity(ours, *([voice] if voice else [])),
        "same_answers": direct.pop("texts") == ours.pop("texts"),
        "direct": direct,
        "ours": ours,
        "voice_to_voice": voice,
        "targets": _targets(direct, ours, voice),
    }


def run(args: argparse.Namespace) -> None:
    if args.llm_url or args.serve_remote:  # the remote tier: its own comparison
        from duplex_bench import llm_remote

        llm_remote.run(args)
        return
    args.prompts = tiny_llm.TEXT_PROMPTS
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.llm) if args.llm else tiny_llm.build(Path(tmp) / "tiny-llm")
        print(json.dumps(measure(path, args)))
