"""``--llm`` under bad input: a checkpoint without a chat template (refused
at start-up, served with ``--llm-chat-template``), a chat longer than the
context window (old turns dropped, said so in the log), an engine that dies
mid-answer (``engine_error``, the session survives, ``/ready`` says so); and
the token figures of an answer, in ``response.done`` and in ``/metrics``."""

from __future__ import annotations

import asyncio
import shutil

import httpx
import pytest

from duplex_bench.tiny_llm import CAPITAL, HELLO, TEMPLATE, trained_chat_model
from duplex_server import cli, metrics
from duplex_server.app import create_app
from duplex_server.engine.llm import LLMConfigError
from tests.conftest import free_port, running_server
from tests.e2e.serverproc import run_cli
from tests.e2e.test_llm_cascade import say
from tests.e2e.test_voice import client_commit_session


async def serving(path, *flags: str):
    config = cli.serve_config(["--llm", str(path), *flags], {})
    config.port = free_port()
    return config


async def loaded(running) -> None:
    model = running.app.state.model
    while not model.loaded:  # the weights load on the engine's thread
        await asyncio.sleep(0.05)


def text_of(events: list[dict]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


async def test_a_checkpoint_without_a_chat_template(tmp_path_factory, tmp_path):
    bare = tmp_path / "no-template"
    shutil.copytree(trained_chat_model(tmp_path_factory.getbasetemp()), bare)
    (bare / "chat_template.jinja").unlink()
    # refused when the server starts, naming the flag that fixes it
    with pytest.raises(LLMConfigError, match="no chat template.*--llm-chat-template"):
        create_app(await serving(bare))
    result = run_cli("duplex_server.cli", "serve", "--llm", str(bare), "--port", "0")
    assert result.returncode != 0 and "--llm-chat-template FILE" in result.stderr
    # served with the template given as a file
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    async with running_server(await serving(bare, "--llm-chat-template", str(template))) as server:
        await loaded(server)
        client = await client_commit_session(server)
        events = await say(client, "What is the capital of Spain?", output_modalities=["text"])
        assert text_of(events) == CAPITAL
        backend = server.app.state.model.responder.engine.core.backend
    # the server's shutdown stopped the decode thread
    assert not backend._thread.is_alive()


async def test_a_long_chat_drops_its_oldest_turns_and_says_so(tmp_path_factory):
    path = trained_chat_model(tmp_path_factory.getbasetemp())
    # 100 tokens: one question and its answer fit, two do not
    flags = ("--llm-max-model-len", "100", "--llm-max-new-tokens", "40")
    async with running_server(await serving(path, *flags)) as server:
        await loaded(server)
        client = await client_commit_session(server)
        events = await say(client, "Say hello.", output_modalities=["text"])
        assert text_of(events) == HELLO
        assert (
            "llm_context_dropped_messages" not in events[-1]["response"]["duplex"]["stage_metrics"]
        )
        events = await say(client, "What is the capital of Spain?", output_modalities=["text"])
        done = events[-1]
        # answered from the last turn alone: the trained reply, never a failed turn
        assert (text_of(events), done["response"]["status"]) == (CAPITAL, "completed")
        stages = done["response"]["duplex"]["stage_metrics"]
        assert stages["llm_context_dropped_messages"] == 2  # the first question and its answer
        # the token figures, journaled with the answer (replay asserts the same)
        assert stages["llm_ttft_ms"] > 0 and stages["llm_tpot_ms"] > 0
        assert stages["llm_output_pieces"] == len(CAPITAL)
        assert 0 < stages["llm_itl_p50_ms"] <= stages["llm_itl_p95_ms"] <= stages["llm_itl_max_ms"]
        assert done["vllm_omni"]["stage_metrics"] == stages
        async with httpx.AsyncClient() as http:
            scrape = (await http.get(f"{server.http_url}/metrics")).text
        for name in ("duplex_llm_ttft_seconds", "duplex_llm_tpot_seconds"):
            assert metrics.sample_value(scrape, f"{name}_count") >= 2
        assert metrics.sample_value(scrape, "duplex_llm_inter_token_seconds_count") >= len(CAPITAL)
        assert metrics.sample_value(scrape, "duplex_stage_seconds_count", {"stage": "llm"}) >= 2
        # a client that does not want them gets none
        await client.send(
            {"type": "session.update", "session": {"extra_body": {"return_stage_metrics": False}}}
        )
        await client.recv_until("session.updated")
        events = await say(client, "Say hello.", output_modalities=["text"])
        assert events[-1]["response"]["duplex"]["stage_metrics"] is None
        assert "vllm_omni" not in events[-1] or events[-1]["vllm_omni"] is None
        await server.assert_replay_determinism()


class EngineFault(Exception):
    """Stands for a failure of the decode thread itself (a driver error)."""


async def test_an_engine_that_dies_mid_answer(tmp_path_factory):
    path = trained_chat_model(tmp_path_factory.getbasetemp())
    async with running_server(await serving(path)) as server:
        await loaded(server)
        backend = server.app.state.model.responder.engine.core.backend
        forward, calls = backend.model.forward, []

        def failing_after_five(*args, **kwargs):
            calls.append(1)
            if len(calls) > 5:
                raise EngineFault("the device fell off the bus")
            return forward(*args, **kwargs)

        backend.model.forward = failing_after_five
        client = await client_commit_session(server)
        events = await say(client, "What is the capital of Spain?", output_modalities=["text"])
        # the answer so far stays; the client hears why it ended
        assert text_of(events) == CAPITAL[:5]
        (error,) = [e for e in events if e["type"] == "error"]
        assert error["error"]["code"] == "engine_error"
        assert "the device fell off the bus" in error["error"]["message"]
        assert events[-1]["response"]["status"] == "failed"
        async with httpx.AsyncClient() as http:
            ready = await http.get(f"{server.http_url}/ready")
        assert ready.status_code == 503 and "model_not_loaded" in ready.json()["reasons"]
        # the session survives: the next answer fails the same way, it stays open
        events = await say(client, "Say hello.", output_modalities=["text"])
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["engine_error"]
        await client.send({"type": "session.heartbeat"})
        await client.recv_until("session.heartbeat_ack")
        await server.assert_replay_determinism()
