"""``--llm-url``: the cascade's LLM on another server, here vLLM's own
OpenAI server (``python -m vllm.entrypoints.openai.api_server``, its CPU
build) in its own process, serving the tiny Qwen2 chat model trained to
known replies. A spoken question answered with the trained reply (its
audio recognised back); through the stock openai SDK: a text conversation, a tool
call round trip (vLLM's Hermes tool parser, so the calls come back as
structured ``tool_calls``), 16 sessions at once. A cancel that lands while
the remote is still decoding the answer (vLLM's scheduler held with its own
dev-mode ``/pause?mode=keep``) closes the remote stream: once resumed,
vLLM runs nothing and never finishes the 400-token answer. The remote
killed with ``kill -9`` mid-answer: ``engine_error``, the session still
serves, ``/ready`` says ``llm_unreachable``; once it is back, the next turn
is answered."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from duplex_bench.tiny_llm import (
    BONJOUR,
    CAPITAL,
    CAPITAL_QUESTIONS,
    COUNT_QUESTION,
    FRANCE,
    FRANCE_QUESTION,
    FRENCH,
    trained_qwen_chat_model,
)
from duplex_bench.vllm_openai import VllmOpenAIServer
from duplex_server import cli
from tests.conftest import RunningServer, free_port, running_server
from tests.e2e.test_llm_backends import (
    PROMPTS,
    assert_spoken_answer,
    assert_tool_round_trip,
    greedy,
    greedy_session,
)
from tests.e2e.test_llm_cascade import text_answer
from tests.e2e.test_llm_tools import text_of, until_done
from tests.vllm_support import KV_CACHE_BYTES, assert_vllm_installed, requires_vllm

pytestmark = [requires_vllm, pytest.mark.asyncio(loop_scope="module")]

SERVED_NAME = "tiny-qwen"
ASKS = 5  # tries at holding an answer mid-decode


class Remote(VllmOpenAIServer):
    """vLLM's OpenAI server in its own process, and its metrics."""

    async def until_gauge(self, http: httpx.AsyncClient, name: str, value: float) -> None:
        """vLLM publishes its gauges after its engine steps, not when asked:
        wait (bounded) for the series to read ``value``."""
        for _ in range(200):
            if await self.gauge(http, name) == value:
                return
            await asyncio.sleep(0.1)
        assert await self.gauge(http, name) == value

    async def gauge(self, http: httpx.AsyncClient, name: str, label: str = "") -> float:
        """The sum of a vLLM series over its labels (those with ``label``), from its /metrics."""
        text = (await http.get(f"{self.url}/metrics")).text
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line
        ]
        assert values, f"{name} is not in vLLM's /metrics"
        return sum(values)


@dataclass
class Tiers:
    remote: Remote
    server: RunningServer
    http: httpx.AsyncClient

    def client(self) -> AsyncOpenAI:
        return AsyncOpenAI(api_key="unused", base_url=f"{self.server.http_url}/v1")


@contextlib.asynccontextmanager
async def rambling(remote: Remote) -> AsyncIterator[RunningServer]:
    """A second server on the same remote whose answers run on to 400
    tokens (``ignore_eos`` passed through by ``--llm-request-arg``), so a
    hold at an answer's first words surely finds it still decoding."""
    flags = ["--llm-url", f"{remote.url}/v1", "--llm-model", SERVED_NAME, "--llm-retries", "0"]
    more = ["--llm-request-arg", "ignore_eos=true", "--llm-max-new-tokens", "400"]
    config = cli.serve_config([*flags, *more], {})
    config.port = free_port()
    async with running_server(config) as server:
        yield server


def client_of(server: RunningServer) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="unused", base_url=f"{server.http_url}/v1")


async def said(connection, text: str) -> str:
    """A rambling answer's text, once it completed."""
    content = [{"type": "input_text", "text": text}]
    await connection.conversation.item.create(
        item={"type": "message", "role": "user", "content": content}
    )
    await connection.response.create()
    events = await until_done(connection)
    assert events[-1].response.status == "completed"
    return text_of(events)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tiers(tmp_path_factory) -> AsyncIterator[Tiers]:
    assert_vllm_installed()
    base = tmp_path_factory.getbasetemp()
    remote = Remote(
        trained_qwen_chat_model(base),
        free_port(),
        base / "vllm-remote.log",
        SERVED_NAME,
        kv_cache_bytes=KV_CACHE_BYTES,
        # 5 ms more a step: a 400-token answer takes seconds, not half of one
        extra_flags=("--logits-processors", "tests.vllm_slow_steps:SlowSteps"),
    )
    remote.start()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            await remote.wait_up(http)
            flags = ["--llm-url", f"{remote.url}/v1", "--llm-model", SERVED_NAME]
            config = cli.serve_config([*flags, "--llm-retries", "0"], {})
            config.port = free_port()
            async with running_server(config) as server:
                yield Tiers(remote, server, http)
                await server.assert_replay_determinism()
    finally:
        remote.kill()


async def test_a_text_conversation_through_the_openai_sdk(tiers):
    assert (await tiers.http.get(f"{tiers.server.http_url}/ready")).status_code == 200
    async with tiers.client().realtime.connect(model="cascade") as connection:
        assert (await connection.recv()).type == "session.created"
        await connection.session.update(session=greedy())
        assert await text_answer(connection, CAPITAL_QUESTIONS[0]) == CAPITAL
        # the chat the remote gets holds the whole conversation
        assert await text_answer(connection, FRANCE_QUESTION) == FRANCE
    assert await greedy_session(tiers.client(), FRENCH, "Say hello.") == BONJOUR


async def test_a_tool_call_round_trip_through_the_openai_sdk(tiers):
    # vLLM's Hermes parser takes the call out of the text; it comes back structured
    await assert_tool_round_trip(tiers.server)


async def test_sixteen_concurrent_sessions_get_their_trained_answers(tiers):
    plan = [PROMPTS[index % len(PROMPTS)] for index in range(16)]
    client = tiers.client()
    answers = await asyncio.gather(*(greedy_session(client, i, q) for i, q, _ in plan))
    assert answers == [answer for _, _, answer in plan]


async def hold(remote: Remote, http: httpx.AsyncClient) -> None:
    """Freeze vLLM's scheduler, its queued and running requests kept."""
    answer = await http.post(f"{remote.url}/pause", params={"mode": "keep"})
    assert answer.status_code == 200, answer.text


async def held_answer(tiers: Tiers, connection) -> str:
    """Ask for the long count with the remote's scheduler frozen, then let
    it run a step or two at a time (a resume and a pause back to back)
    until the answer's first words reach the client: the answer is then
    unfinished in vLLM. The tiny model decodes a token a millisecond, and
    a hold placed only once the first words arrived lost the race every time
    on CI's loaded machine; the remote now runs 5 ms longer a step
    (``tests/vllm_slow_steps.py``), and an answer that still finished before
    its hold is let be and the count asked for again."""
    for _ in range(ASKS):
        response_id = await _held_ask(tiers, connection)
        if response_id is not None:
            return response_id
    raise AssertionError(f"every one of {ASKS} answers finished before it was held")


async def _held_ask(tiers: Tiers, connection) -> str | None:
    """The answer's id once it is held mid-decode; None if it finished first."""
    remote, http = tiers.remote, tiers.http
    await hold(remote, http)
    content = [{"type": "input_text", "text": COUNT_QUESTION}]
    await connection.conversation.item.create(
        item={"type": "message", "role": "user", "content": content}
    )
    await connection.response.create()
    for _ in range(200):  # each window decodes a few of the 400 tokens, as a rule
        await http.post(f"{remote.url}/resume")
        await hold(remote, http)
        with contextlib.suppress(TimeoutError):
            while True:  # what that window produced
                event = await asyncio.wait_for(connection.recv(), timeout=0.2)
                if event.type == "response.done":
                    return None
                if event.type == "response.output_text.delta":
                    return event.response_id
    raise AssertionError("the answer's first words never came")


async def test_a_cancel_closes_the_remote_stream(tiers):
    remote, http = tiers.remote, tiers.http
    async with (
        rambling(remote) as server,
        client_of(server).realtime.connect(model="cascade") as connection,
    ):
        assert (await connection.recv()).type == "session.created"
        await connection.session.update(session=greedy(output_modalities=["text"]))
        lengthy = 'finished_reason="length"'
        try:
            # a 400-token answer held at its first words: still decoding
            response_id = await held_answer(tiers, connection)
            # (an answer that finished before a hold is counted by now)
            ran_out = await remote.gauge(http, "vllm:request_success_total", lengthy)
            await connection.response.cancel()
            events = await until_done(connection)
            assert events[-1].response.id == response_id
            assert events[-1].response.status == "cancelled"
        finally:
            await http.post(f"{remote.url}/resume")
        # vLLM let go of it (its gauges move once its engine steps again),
        # and never finished it: an answer left generating would have run
        # out at its 400 tokens
        await remote.until_gauge(http, "vllm:num_requests_running", 0)
        assert await remote.gauge(http, "vllm:request_success_total", lengthy) == ran_out
        # the session serves on (the cut count is in its chat, so the tiny
        # model's next words are not the trained reply: only that it answers)
        assert await said(connection, CAPITAL_QUESTIONS[0])


async def test_the_remote_killed_mid_answer(tiers):
    remote, http = tiers.remote, tiers.http
    async with (
        rambling(remote) as server,
        client_of(server).realtime.connect(model="cascade") as connection,
    ):
        ready = f"{server.http_url}/ready"
        assert (await connection.recv()).type == "session.created"
        await connection.session.update(session=greedy(output_modalities=["text"]))
        await held_answer(tiers, connection)  # 400 tokens held at their first: mid-answer
        remote.kill()
        try:
            errors = []
            async for event in connection:
                if event.type == "error":
                    errors.append(event.error.code)
                if event.type == "response.done":
                    assert event.response.status == "failed"
                    break
            assert errors == ["engine_error"]
            answer = await http.get(ready)
            assert answer.status_code == 503
            assert "llm_unreachable" in answer.json()["reasons"]
        finally:  # the module's later tests need it back
            remote.start()
            await remote.wait_up(http)
        while (await http.get(ready)).status_code != 200:
            await asyncio.sleep(0.2)
        # the same session answers its next turn
        # the session serves on (the cut count is in its chat, so the tiny
        # model's next words are not the trained reply: only that it answers)
        assert await said(connection, CAPITAL_QUESTIONS[0])


async def test_a_spoken_question_is_answered_with_the_trained_reply(tiers):
    await assert_spoken_answer(tiers.server)


async def test_bench_llm_against_the_remote_reports_every_figure(tiers):
    """``bench llm --llm-url``: the same remote through a server of its own
    and called directly, at two concurrencies, in one JSON report. No
    figure is judged against a clock: the machine's speed is not under test."""
    command = [sys.executable, "-m", "duplex_server.cli", "bench", "llm"]
    command += ["--llm-url", f"{tiers.remote.url}/v1", "--llm-model", SERVED_NAME]
    command += ["--remote-sessions", "1,2", "--repeats", "1", "--ignore-eos"]
    command += ["--max-new-tokens", "64"]
    bench = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await bench.communicate()
    assert bench.returncode == 0, err.decode()[-4000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["bench"] == "llm" and report["mode"] == "remote"
    assert report["remote_spawned"] is False and report["remote_cpu_percent"] is None
    assert isinstance(report["valid"], bool) and report["counts"] == [1, 2]
    for row, sessions in zip(report["rows"], [1, 2], strict=True):
        assert row["sessions"] == sessions
        # greedy on both paths, past the end of the answer: the same 64 tokens
        assert row["same_answers"] is True
        for side in (row["direct"], row["ours"]):
            assert side["chars_per_s"] > 0
            assert 0 < side["ttft_ms"]["p50"] <= side["ttft_ms"]["p99"]
        assert row["direct"]["ttft_ms"]["n"] == row["ours"]["ttft_ms"]["n"] == 3 * sessions
        assert row["direct"]["delta_ms"]["n"] == 3 * sessions  # every answer: many deltas
        assert row["ours"]["server_cpu_percent"] > 0 and row["throughput_ratio"] > 0
        assert isinstance(row["machine_saturated"], bool)
    abort = report["abort"]
    assert abort["sessions"] == 2 and abort["abort_to_silence_ms"]["n"] <= 2
    targets = report["targets"]
    verdicts = [
        "ttft_overhead_at_most_10ms",
        "throughput_at_least_0_95",
        "abort_p99_within_one_token_plus_5ms",
    ]
    assert all(isinstance(targets[name], bool) for name in verdicts)
    assert isinstance(targets["judged"], bool)
    assert targets["abort_limit_ms"] > 5.0
