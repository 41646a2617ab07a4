"""``duplex-server bench llm --llm-url URL``: what the session tier adds to
a remote LLM tier.

The same prompts go to the same OpenAI-compatible remote two ways in one
run, turn about so the shared machine's load falls on both alike:

- Direct: this process streams ``POST {URL}/chat/completions`` itself (one
  pooled httpx client, the body the server would send: the same messages,
  temperature 0 and ``max_tokens``).
- Ours: a server process with ``--llm-url URL --llm-model NAME``; text
  sessions over WebSockets, each question in a fresh session.

For each concurrency in ``--remote-sessions`` (1, 8, 32): TTFT (at 1: each
prompt alone ``--repeats`` times, each direct sample followed by the
server's; above: every request of the concurrent windows), then ``ROUNDS``
concurrent windows each side: text per second (the tiny model has a token
a character, so its ratio is the tokens/s ratio) and the remote's gap
between an answer's deltas (one remote token). Last, at the highest
concurrency, every session cancels at its first delta: abort-to-silence
(the last delta that still arrived after ``response.cancel``).

``--serve-remote`` starts the remote itself: vLLM's own OpenAI server (its
CPU build) on ``--llm`` or the tiny chat model trained here. Server, remote
and generator CPU are reported; the run is invalid when the generator
(this process: the direct client and the sessions) saturated its core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from duplex_bench import tiny_llm
from duplex_bench.generator import GeneratorCpu, validity
from duplex_bench.llm import (
    Window,
    _ask_fresh,
    _direct_window,
    _quantiles,
    _server_round,
    _wait_ready,
)
from duplex_bench.server_process import ServerProcess, free_port
from duplex_bench.vllm_openai import VllmOpenAIServer

ROUNDS = 3
# what the tests' tiny Qwen chat model (the one --serve-remote trains) knows
PROMPTS = (tiny_llm.CAPITAL_QUESTIONS[0], "Say hello.", tiny_llm.COUNT_QUESTION)
TARGET_TTFT_OVERHEAD_MS = 10.0  # p50, one session
TARGET_THROUGHPUT_RATIO = 0.95  # at the highest concurrency
TARGET_ABORT_SLACK_MS = 5.0  # over one remote token
MACHINE_SATURATED = 90.0  # percent of all cores


class DirectRemote:
    """The remote called as its own clients call it: streamed chat.completions."""

    steps = None  # the remote's decode steps are not ours to count

    def __init__(self, url: str, model: str, api_key: str | None, more: dict[str, Any]) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        self.url = url.rstrip("/") + "/chat/completions"
        self.model = model
        self.more = more  # what the server's --llm-request-arg adds
        self.http = httpx.AsyncClient(headers=headers, limits=limits, timeout=120.0)

    async def stream(self, prompt: str, tag: str, max_new: int) -> AsyncIterator[str]:
        body = {
            **self.more,
            "model": self.model,
            "messages": tiny_llm.chat(prompt),
            "stream": True,
            "temperature": 0.0,
            "max_tokens": max_new,
        }
        async with self.http.stream("POST", self.url, json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[5:])["choices"]
                delta = choices[0]["delta"].get("content") if choices else None
                if delta:
                    yield delta

    async def aclose(self) -> None:
        await self.http.aclose()


async def _one_session_ttft(
    direct: DirectRemote, url: str, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """Each prompt alone, ``--repeats`` times, direct then ours."""
    direct_ttft, ours_ttft = [], []
    for _ in range(args.repeats):
        for prompt in args.prompts:
            window, _ = await _direct_window(direct, [prompt], args.max_new_tokens)
            direct_ttft.extend(window.ttft_ms)
            (answer,) = await _ask_fresh(url, [prompt])
            ours_ttft.append(answer["ttft_ms"])
    return direct_ttft, ours_ttft


async def _row(
    direct: DirectRemote, url: str, args: argparse.Namespace, count: int, server: psutil.Process
) -> dict:
    """One concurrency: TTFT, then ``ROUNDS`` windows of each side, turn about."""
    prompts = [args.prompts[i % len(args.prompts)] for i in range(count)]
    direct_ttft: list[float] = []
    ours_ttft: list[float] = []
    psutil.cpu_percent(None)  # the whole machine's, over the row
    if count == 1:
        direct_ttft, ours_ttft = await _one_session_ttft(direct, url, args)
    direct_windows: list[Window] = []
    tokens: list[float] = []
    ours: dict = {}
    for _ in range(ROUNDS):
        generator = GeneratorCpu()
        generator.start()
        window, arrivals = await _direct_window(direct, prompts, args.max_new_tokens)
        direct_windows.append(window)
        tokens.extend(_token_ms(arrivals))
        ours.setdefault("direct_reports", []).append(generator.report())
        await _server_round(url, prompts, server, ours)
    if count > 1:
        direct_ttft = [ms for w in direct_windows for ms in w.ttft_ms]
        ours_ttft = [ms for w in ours["windows"] for ms in w.ttft_ms]
    row = _row_report(count, direct_windows, tokens, direct_ttft, ours, ours_ttft)
    machine = psutil.cpu_percent(None)
    # a remote on this machine competes with both sides for its cores: past
    # this, the row measures that contention, not what the session tier adds
    row.update(machine_cpu_percent=machine, machine_saturated=machine >= MACHINE_SATURATED)
    return row


def _token_ms(arrivals: list[list]) -> list[float]:
    """Each answer's time a delta, first to last: one remote token (the
    gaps themselves are no measure, as deltas come off the socket in bursts)."""
    return [(run[-1][1] - run[0][1]) / (len(run) - 1) for run in arrivals if len(run) > 1]


def _chars_per_s(windows: list[Window]) -> float:
    seconds = sum(w.seconds for w in windows)
    return sum(w.chars for w in windows) / seconds if seconds else 0.0


def _row_report(
    count: int,
    direct_windows: list[Window],
    tokens: list[float],
    direct_ttft: list[float],
    ours: dict,
    ours_ttft: list[float],
) -> dict:
    direct_rate, ours_rate = _chars_per_s(direct_windows), _chars_per_s(ours["windows"])
    reports = ours["reports"] + ours["direct_reports"]
    busiest = max(reports, key=lambda r: r["generator_cpu_percent"])
    direct = {"ttft_ms": _quantiles(direct_ttft, 50, 99), "chars_per_s": round(direct_rate, 1)}
    return {
        "sessions": count,
        "direct": {**direct, "delta_ms": _quantiles(tokens, 50, 99)},
        "ours": {
            "ttft_ms": _quantiles(ours_ttft, 50, 99),
            "chars_per_s": round(ours_rate, 1),
            "server_cpu_percent": round(statistics.fmean(ours["server_cpu"]), 1),
        },
        **busiest,
        "same_answers": direct_windows[-1].texts == ours["windows"][-1].texts,
        "ttft_overhead_ms_p50": round(
            statistics.median(ours_ttft) - statistics.median(direct_ttft), 2
        ),
        "throughput_ratio": round(ours_rate / direct_rate, 4) if direct_rate else None,
    }


async def _abort(url: str, count: int, prompts: list[str]) -> dict:
    """Every session cancels at its first delta."""
    asked = [prompts[i % len(prompts)] for i in range(count)]
    aborts = await _ask_fresh(url, asked, cancel=True)
    silences = [a["abort_to_silence_ms"] for a in aborts if a["abort_to_silence_ms"] is not None]
    done = [a["cancel_to_done_ms"] for a in aborts if a["cancel_to_done_ms"] is not None]
    return {
        "sessions": count,
        "cancelled_mid_answer": sum(a["status"] == "cancelled" for a in aborts),
        "abort_to_silence_ms": _quantiles(silences, 50, 99),
        "cancel_to_response_done_ms": _quantiles(done, 50, 99),
    }


async def _measure(url: str, args: argparse.Namespace, server: ServerProcess) -> dict:
    proc = psutil.Process(server.pid)
    direct = DirectRemote(url, args.llm_model, args.llm_api_key, _request_args(args))
    try:
        await _direct_window(direct, args.prompts, args.max_new_tokens)  # warm-up
        await _ask_fresh(server.ws_url, args.prompts)
        rows = [await _row(direct, server.ws_url, args, n, proc) for n in args.counts]
        abort = await _abort(server.ws_url, args.counts[-1], args.prompts)
    finally:
        await direct.aclose()
    return {"rows": rows, "abort": abort}


def _targets(rows: list[dict], abort: dict) -> dict:
    first, last = rows[0], rows[-1]
    token_ms = last["direct"]["delta_ms"]["p50"]
    abort_p99 = abort["abort_to_silence_ms"]["p99"]
    limit = round(token_ms + TARGET_ABORT_SLACK_MS, 3) if token_ms is not None else None
    return {
        # a row whose machine was saturated (the remote on the same cores)
        # measured that contention: its verdicts are not the session tier's
        "judged": not (first["machine_saturated"] or last["machine_saturated"]),
        "ttft_overhead_ms_p50": first["ttft_overhead_ms_p50"],
        "ttft_overhead_at_most_10ms": first["ttft_overhead_ms_p50"] <= TARGET_TTFT_OVERHEAD_MS,
        "throughput_ratio": last["throughput_ratio"],
        "throughput_at_least_0_95": (last["throughput_ratio"] or 0) >= TARGET_THROUGHPUT_RATIO,
        "abort_limit_ms": limit,
        # no delta after the cancel reads as 0 ms, within any limit
        "abort_p99_within_one_token_plus_5ms": (
            limit is not None and (abort_p99 is None or abort_p99 <= limit)
        ),
    }


def _request_args(args: argparse.Namespace) -> dict[str, Any]:
    """Fields both sides add to each request (vLLM's and SGLang's own):
    past the end of the answer the model's words are special tokens, kept
    in the text so that it grows a token at a time."""
    return {"ignore_eos": True, "skip_special_tokens": False} if args.ignore_eos else {}


def _server(url: str, args: argparse.Namespace) -> ServerProcess:
    # every question has its own session, and a closed one may still count
    # against the cap for a while: room for all of them
    sessions = sum((ROUNDS + 2) * n for n in args.counts) + args.repeats * len(args.prompts) + 16
    server = ServerProcess(
        "memory",
        model="cascade",
        llm_url=url,
        llm_model=args.llm_model,
        llm_retries=0,
        llm_max_new_tokens=args.max_new_tokens,
        llm_max_num_seqs=max(args.counts),
        llm_api_key=args.llm_api_key,
        llm_request_arg=",".join(f"{k}={json.dumps(v)}" for k, v in _request_args(args).items())
        or None,
        max_sessions=sessions,
    )
    server.start(timeout_s=120.0)
    _wait_ready(server)
    return server


def _remote_cpu(remote: VllmOpenAIServer | None) -> float | None:
    """The spawned remote's CPU over the run (its process and children), in
    percent of one core; None when the remote is someone else's."""
    if remote is None or remote.process is None:
        return None
    root = psutil.Process(remote.process.pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        times = proc.cpu_times()
        total += times.user + times.system
    return round(total, 2)


def measure(url: str, args: argparse.Namespace, remote: VllmOpenAIServer | None = None) -> dict:
    load_before = [round(x, 2) for x in os.getloadavg()]
    remote_cpu_before = _remote_cpu(remote)
    started = time.perf_counter()
    server = _server(url, args)
    try:
        measured = asyncio.run(_measure(url, args, server))
    finally:
        server.stop()
    seconds = time.perf_counter() - started
    rows, abort = measured["rows"], measured["abort"]
    remote_cpu = _remote_cpu(remote)
    return {
        "bench": "llm",
        "mode": "remote",
        "remote": url,
        "model": args.llm_model,
        "remote_spawned": remote is not None,
        "counts": args.counts,
        "repeats": args.repeats,
        "rounds": ROUNDS,
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "load_average_start": load_before,
        **validity(*rows),
        "saturated_rows": [row["sessions"] for row in rows if row["machine_saturated"]],
        "remote_cpu_percent": (
            round(100 * (remote_cpu - remote_cpu_before) / seconds, 1)
            if remote_cpu is not None and remote_cpu_before is not None
            else None
        ),
        "rows": rows,
        "abort": abort,
        "targets": _targets(rows, abort),
    }


async def _serve_remote(path: Path, log: Path, args: argparse.Namespace) -> VllmOpenAIServer:
    remote = VllmOpenAIServer(
        path, free_port(), log, args.llm_model, kv_cache_bytes=args.kv_cache_bytes
    )
    remote.start()
    async with httpx.AsyncClient(timeout=30) as http:
        try:
            await remote.wait_up(http)
        except RuntimeError as exc:
            remote.kill()
            raise SystemExit(f"bench llm: {exc}") from None
    return remote


def run(args: argparse.Namespace) -> None:
    args.prompts = list(PROMPTS)
    args.counts = sorted({int(n) for n in args.remote_sessions.split(",")})
    args.llm_api_key = args.llm_api_key or os.environ.get("DUPLEX_SERVER_LLM_API_KEY")
    if not args.serve_remote:
        print(json.dumps(measure(args.llm_url, args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.llm) if args.llm else tiny_llm.trained_qwen_chat_model(Path(tmp))
        remote = asyncio.run(_serve_remote(path, Path(tmp) / "vllm.log", args))
        try:
            print(json.dumps(measure(f"{remote.url}/v1", args, remote)))
        finally:
            remote.kill()
