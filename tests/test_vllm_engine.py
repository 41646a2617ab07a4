"""The vLLM AR backend on vLLM's CPU build: the tiny Qwen2 chat model
(``duplex_bench.tiny_llm.tiny_qwen_chat_model``), decoded by vLLM's async engine
through EngineCore, against the transformers backend on the same checkpoint.
One engine serves the whole test session: it takes tens of seconds to start."""

from __future__ import annotations

import asyncio
import json

import psutil
import pytest

from duplex_bench.tiny_llm import (
    BONJOUR,
    CAPITAL,
    COUNT,
    COUNT_QUESTION,
    FRENCH,
    HELLO,
    QWEN_SCRIPT,
    chat,
    trained_qwen_chat_model,
)
from duplex_server.engine import EngineRequest
from duplex_server.engine.core import RequestAborted
from duplex_server.engine.llm import (
    ChatPayload,
    LLMConfigError,
    LLMOptions,
    build_llm_engine,
    choose_backend,
    vllm_build,
)
from duplex_server.engine.llm.vllm_backend import GenerationFailed
from tests.vllm_support import assert_vllm_installed, requires_vllm, vllm_options

pytestmark = requires_vllm


@pytest.fixture(scope="session")
def qwen(tmp_path_factory):
    return trained_qwen_chat_model(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def llm(qwen):
    assert_vllm_installed()
    # one engine argument passed through by name (--llm-engine-arg), checked below
    engine = build_llm_engine(vllm_options(qwen, engine_args=("max_num_batched_tokens=3072",)))
    # a bound on a broken start, not a measurement
    assert engine.state.wait_loaded(900), engine.state.load_error  # type: ignore[attr-defined]
    yield engine
    engine.core.backend.close()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def reference(qwen):
    """The transformers backend on the same checkpoint."""
    engine = build_llm_engine(LLMOptions(str(qwen), backend="transformers", dtype="float32"))
    assert engine.state.wait_loaded(120), engine.state.load_error  # type: ignore[attr-defined]
    yield engine
    engine.core.backend.close()  # type: ignore[attr-defined]


def ask(rid: str, user: str, system: str = "", temperature: float = 0.0, cap: int = 64):
    payload = ChatPayload(chat(user, system), temperature=temperature, max_new_tokens=cap)
    return EngineRequest(request_id=rid, session_id="s", response_id=rid, epoch=0, payload=payload)


async def answer(llm, request) -> list[str]:
    return [delta async for delta in llm.core.submit(request)]


def test_an_engine_argument_reaches_vllm_as_vllm_parsed_it(llm):
    engine = llm.core.backend._engine  # type: ignore[attr-defined]
    assert engine.vllm_config.scheduler_config.max_num_batched_tokens == 3072


async def test_greedy_answers_are_the_transformers_backends(llm, reference):
    for index, (system, user, reply) in enumerate(QWEN_SCRIPT):
        deltas = await answer(llm, ask(f"v{index}", user, system, cap=96))
        expected = await answer(reference, ask(f"t{index}", user, system, cap=96))
        # vLLM's deltas are each step's tokens, merged when its output handler
        # runs behind the engine: the same text, maybe in fewer pieces
        assert "".join(deltas) == "".join(expected) == reply
        assert 0 < len(deltas) <= len(expected)


async def test_concurrent_requests_all_complete(llm):
    questions = [
        ("What is the capital of Spain?", "", CAPITAL),
        ("Say hello.", "", HELLO),
        ("Say hello.", FRENCH, BONJOUR),
        (COUNT_QUESTION, "", COUNT),
    ] * 2
    answers = await asyncio.gather(
        *(answer(llm, ask(f"c{n}", user, system)) for n, (user, system, _) in enumerate(questions))
    )
    assert ["".join(deltas) for deltas in answers] == [reply for _, _, reply in questions]
    assert llm.core.backend.unfinished_requests() == 0


async def test_a_token_cap_and_sampling(llm, reference):
    # the transformers backend sends a delta a token
    tokens = await answer(reference, ask("tokens", COUNT_QUESTION, cap=96))
    assert "".join(await answer(llm, ask("cap", COUNT_QUESTION, cap=5))) == "".join(tokens[:5])
    full = "".join(tokens)
    samples = [
        await answer(llm, ask(f"hot{n}", COUNT_QUESTION, temperature=2.0, cap=20)) for n in range(4)
    ]
    assert all(len(sampled) <= 20 for sampled in samples)  # a delta holds a token or more
    assert any(not full.startswith("".join(sampled)) for sampled in samples)
    # vLLM samples at temperatures up to 2; above, the request fails, saying so
    with pytest.raises(GenerationFailed, match=r"temperature must be in \[0, 2\]"):
        await answer(llm, ask("too-hot", COUNT_QUESTION, temperature=2.5))


async def test_abort_stops_decoding_in_vllm(llm):
    backend = llm.core.backend
    stream = llm.core.submit(ask("gone", COUNT_QUESTION, cap=96))
    first = await anext(stream)
    llm.core.abort("gone")
    with pytest.raises(RequestAborted):
        async for _ in stream:
            pass
    assert COUNT.startswith(first) and first != COUNT
    # The stream closed only once vLLM had dropped the request: the engine
    # holds nothing, though the answer had dozens of tokens to go.
    assert backend.unfinished_requests() == 0
    assert "".join(await answer(llm, ask("after", "Say hello."))) == HELLO


async def test_a_cancelled_consumer_aborts_its_request(llm):
    backend = llm.core.backend
    got: list[str] = []

    async def consume():
        async for delta in llm.core.submit(ask("cancelled", COUNT_QUESTION, cap=96)):
            got.append(delta)

    task = asyncio.create_task(consume())
    while not got:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.unfinished_requests() == 0
    assert "".join(got) != COUNT and COUNT.startswith("".join(got))
    assert "".join(await answer(llm, ask("next", "Say hello."))) == HELLO


async def test_a_prompt_longer_than_the_window_fails_alone(llm):
    request = ask("long", "word " * 600)  # max_model_len is 512
    with pytest.raises(GenerationFailed, match="generation failed") as failure:
        await answer(llm, request)
    assert "512" in str(failure.value)
    assert llm.core.backend.loaded
    assert "".join(await answer(llm, ask("fine", "Say hello."))) == HELLO


def test_vllm_is_chosen_where_it_can_size_its_kv_cache(tmp_path):
    assert vllm_build() == "cpu"
    assert choose_backend(LLMOptions(str(tmp_path), backend="auto", kv_cache_bytes=1 << 26)) == (
        "vllm"
    )
    assert choose_backend(LLMOptions(str(tmp_path), backend="auto")) == "transformers"
    with pytest.raises(LLMConfigError, match="needs --llm-kv-cache-bytes"):
        build_llm_engine(LLMOptions(str(tmp_path), backend="vllm"))
    with pytest.raises(LLMConfigError, match="no config.json"):
        build_llm_engine(vllm_options(tmp_path))
    with pytest.raises(LLMConfigError, match="give a size > 0"):
        build_llm_engine(vllm_options(tmp_path, kv_cache_bytes=0))


async def test_a_directory_that_is_no_checkpoint_fails_to_load(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    # a template file passes the start-up check; the weights are what is missing
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    engine = build_llm_engine(vllm_options(tmp_path))
    backend = engine.core.backend
    try:
        assert not engine.state.wait_loaded(300)  # type: ignore[attr-defined]
        assert not engine.state.loaded
        assert f"cannot load {tmp_path}" in (engine.state.load_error or "")
        with pytest.raises(GenerationFailed, match="cannot load"):
            await answer(engine, ask("x", "Say hello."))
    finally:
        backend.close()  # type: ignore[attr-defined]


async def test_an_engine_that_dies_mid_answer_fails_its_requests_and_goes_unready(qwen):
    engine = build_llm_engine(vllm_options(qwen))
    backend = engine.core.backend
    try:
        assert engine.state.wait_loaded(900), engine.state.load_error  # type: ignore[attr-defined]
        cores = [
            psutil.Process(pid)
            for pid in backend.engine_pids  # type: ignore[attr-defined]
            if psutil.Process(pid).name() == "VLLM::EngineCore"
        ]
        assert len(cores) == 1
        stream = engine.core.submit(ask("dying", COUNT_QUESTION, cap=96))
        first = await anext(stream)
        assert COUNT.startswith(first) and first != COUNT
        cores[0].kill()
        with pytest.raises(GenerationFailed, match="EngineDeadError"):
            async for _ in stream:
                pass
        assert not engine.state.loaded  # /ready says so
        with pytest.raises(GenerationFailed, match="died"):
            await answer(engine, ask("later", "Say hello."))
    finally:
        backend.close()  # type: ignore[attr-defined]
