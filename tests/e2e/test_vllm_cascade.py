"""``--llm PATH --llm-backend vllm``: the cascade answers with the tiny Qwen2
chat model (tests/tiny_qwen_chat.py) decoded by vLLM's CPU build, in text
through the stock openai SDK; ``/ready`` says 503 until the engine is up."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import AsyncOpenAI

from duplex_server import cli
from tests.conftest import free_port, running_server
from tests.e2e.test_llm_cascade import text_answer
from tests.tiny_chat import BONJOUR, CAPITAL, FRENCH, HELLO
from tests.tiny_qwen_chat import COUNT, COUNT_QUESTION, trained_qwen_chat_model
from tests.vllm_support import SERVE_FLAGS, assert_vllm_installed, requires_vllm

pytestmark = requires_vllm


async def wait_ready(http: httpx.AsyncClient, url: str, model) -> list[dict]:
    """Poll /ready until 200; returns the 503 answers seen on the way."""
    unready = []
    while True:
        answer = await http.get(f"{url}/ready")
        if answer.status_code == 200:
            assert model.loaded
            return unready
        assert answer.status_code == 503
        unready.append(answer.json())
        await asyncio.sleep(0.1)


async def ask(client: AsyncOpenAI, question: str, instructions: str = "") -> str:
    async with client.realtime.connect(model="cascade") as connection:
        assert (await connection.recv()).type == "session.created"
        if instructions:
            await connection.session.update(
                session={"type": "realtime", "instructions": instructions}
            )
        return await text_answer(connection, question)


async def test_text_conversations_through_the_openai_sdk(tmp_path_factory):
    assert_vllm_installed()
    path = trained_qwen_chat_model(tmp_path_factory.getbasetemp())
    config = cli.serve_config(["--llm", str(path), *SERVE_FLAGS], {})
    config.port = free_port()
    async with running_server(config) as running, httpx.AsyncClient() as http:
        model = running.app.state.model
        backend = model.responder.engine.core.backend
        try:
            unready = await wait_ready(http, running.http_url, model)
            # while it loaded (tens of seconds, from before the server listened),
            # /ready said why
            assert unready
            assert all(answer["reasons"] == ["model_not_loaded"] for answer in unready)
            client = AsyncOpenAI(api_key="unused", base_url=f"{running.http_url}/v1")
            assert await ask(client, "What is the capital of Spain?") == CAPITAL
            # the session's instructions are the system message
            assert await ask(client, "Say hello.", FRENCH) == BONJOUR
            # sessions answered at once, batched by vLLM
            questions = ["What is the capital of Spain?", "Say hello.", COUNT_QUESTION] * 2
            answers = await asyncio.gather(*(ask(client, q) for q in questions))
            assert answers == [CAPITAL, HELLO, COUNT] * 2
            await running.assert_replay_determinism()
        finally:
            backend.close()


def test_vllm_without_a_kv_cache_size_is_refused_at_start(tmp_path):
    assert_vllm_installed()
    from duplex_server.app import create_app

    config = cli.serve_config(["--llm", str(tmp_path), "--llm-backend", "vllm"], {})
    with pytest.raises(ValueError, match="needs --llm-kv-cache-bytes"):
        create_app(config)
