"""The transformers AR backend: a trained tiny chat model decoded through
EngineCore, every active request advanced by one token per forward."""

from __future__ import annotations

import asyncio

import pytest

from duplex_server.engine import EngineRequest
from duplex_server.engine.core import RequestAborted
from duplex_server.engine.llm import (
    ChatPayload,
    LLMConfigError,
    LLMOptions,
    build_llm_engine,
    vllm_build,
)
from tests.tiny_chat import BONJOUR, CAPITAL, FRENCH, HELLO, chat, trained_chat_model


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    engine = build_llm_engine(LLMOptions(str(trained_chat_model(tmp_path_factory.getbasetemp()))))
    assert engine.state.wait_loaded(60), engine.state.load_error  # type: ignore[attr-defined]
    yield engine
    engine.core.backend.close()  # type: ignore[attr-defined]


def ask(rid: str, user: str, system: str = "", temperature: float = 0.0, cap: int = 64):
    payload = ChatPayload(chat(user, system), temperature=temperature, max_new_tokens=cap)
    return EngineRequest(request_id=rid, session_id="s", response_id=rid, epoch=0, payload=payload)


async def answer(llm, request) -> list[str]:
    return [delta async for delta in llm.core.submit(request)]


async def test_greedy_answers_are_the_trained_replies(llm):
    deltas = await answer(llm, ask("a", "What is the capital of Spain?"))
    assert "".join(deltas) == CAPITAL
    assert len(deltas) == len(CAPITAL)  # one character a token, streamed as decoded
    assert "".join(await answer(llm, ask("b", "Say hello.", system=FRENCH))) == BONJOUR


async def test_concurrent_requests_share_forwards(llm):
    backend = llm.core.backend
    steps, sizes = backend.steps, len(backend.step_sizes)
    capital, hello = await asyncio.gather(
        answer(llm, ask("c1", "what is the capital of spain")), answer(llm, ask("c2", "Say hello."))
    )
    assert ("".join(capital), "".join(hello)) == (CAPITAL, HELLO)
    forwards = backend.steps - steps
    batch = backend.step_sizes[sizes:]
    # Each request's first token comes from its prefill, the rest from steps
    # (plus the end-of-sequence token of each); all ran in shared forwards.
    tokens = len(CAPITAL) + len(HELLO)
    assert sum(batch) == tokens
    assert max(batch) == 2
    assert forwards < tokens


async def test_a_token_cap_and_sampling(llm):
    assert "".join(await answer(llm, ask("cap", "Say hello.", cap=5))) == HELLO[:5]
    sampled = "".join(await answer(llm, ask("hot", "Say hello.", temperature=50.0, cap=20)))
    assert 0 < len(sampled) <= 20 and sampled != HELLO


async def test_abort_stops_the_stream_and_frees_the_batch(llm):
    backend = llm.core.backend
    request = ask("gone", "What is the capital of Spain?")
    stream = llm.core.submit(request)
    first = await anext(stream)
    llm.core.abort("gone")
    with pytest.raises(RequestAborted):
        async for _ in stream:
            pass
    assert first == CAPITAL[0]
    # the request left the decode batch; others run on unharmed
    assert "".join(await answer(llm, ask("after", "Say hello."))) == HELLO
    assert not backend._active


async def test_a_cancelled_consumer_leaves_the_batch(llm):
    backend = llm.core.backend
    got: list[str] = []

    async def consume():
        async for delta in llm.core.submit(ask("cancelled", "What is the capital of Spain?")):
            got.append(delta)

    task = asyncio.create_task(consume())
    while not got:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "".join(await answer(llm, ask("next", "Say hello."))) == HELLO
    assert len(got) < len(CAPITAL) and not backend._active


@pytest.mark.skipif(
    vllm_build() is not None,
    reason="vLLM is installed here: tests/test_vllm_engine.py checks its refusals",
)
def test_vllm_is_refused_by_name_where_it_is_not_installed(tmp_path):
    with pytest.raises(LLMConfigError, match="vLLM is not installed"):
        build_llm_engine(LLMOptions(str(tmp_path), backend="vllm"))


def test_a_directory_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(LLMConfigError, match="no config.json"):
        build_llm_engine(LLMOptions(str(tmp_path)))
