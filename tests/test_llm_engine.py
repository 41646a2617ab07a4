"""The transformers AR backend: a trained tiny chat model decoded through
EngineCore, every active request advanced by one token per forward, those
that arrive together prefilled in one forward."""

from __future__ import annotations

import asyncio
import threading

import pytest

from duplex_bench.tiny_llm import BONJOUR, CAPITAL, FRENCH, HELLO, chat, trained_chat_model
from duplex_server.engine import EngineRequest
from duplex_server.engine.core import RequestAborted
from duplex_server.engine.llm import (
    ChatPayload,
    LLMConfigError,
    LLMOptions,
    build_llm_engine,
    vllm_build,
)


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


# Questions of different prompt lengths (the system message adds to one):
# prefilled together they are left-padded to the longest.
BURST = [
    ("What is the capital of Spain?", "", CAPITAL),
    ("Say hello.", "", HELLO),
    ("Say hello.", FRENCH, BONJOUR),
    ("what is the capital of spain", "", CAPITAL),
]


async def burst(llm, tag: str) -> tuple[list[str], list[int]]:
    """BURST's questions all waiting in line at once: the decode thread is
    held in a step of another answer while they arrive, then let go. Their
    answers, and the rows of each prefill forward that took them."""
    backend = llm.core.backend
    step, stepping, resume = backend._step, threading.Event(), threading.Event()

    def held() -> None:
        stepping.set()
        resume.wait(60)
        step()

    backend._step = held
    try:
        busy = asyncio.create_task(answer(llm, ask(f"{tag}-busy", "Say hello.")))
        await asyncio.to_thread(stepping.wait, 60)
        backend._step = step  # (the held step goes on to the real one)
        before = len(backend.prefill_sizes)  # the busy answer's is done
        asks = [ask(f"{tag}{i}", user, system) for i, (user, system, _) in enumerate(BURST)]
        answers = [asyncio.create_task(answer(llm, request)) for request in asks]
        while len(backend._joining) < len(BURST):
            await asyncio.sleep(0.001)
    finally:
        backend._step = step
        resume.set()
    assert "".join(await busy) == HELLO
    texts = ["".join(deltas) for deltas in await asyncio.gather(*answers)]
    return texts, backend.prefill_sizes[before:]


async def test_requests_that_arrive_together_prefill_in_one_padded_forward(llm):
    backend = llm.core.backend
    # each alone: the greedy answers to compare with
    serial = []
    for i, (user, system, _) in enumerate(BURST):
        serial.append("".join(await answer(llm, ask(f"alone{i}", user, system))))
    assert serial == [reply for _, _, reply in BURST]
    # together: the same greedy answers, from one prefill forward
    assert await burst(llm, "together") == (serial, [len(BURST)])
    # a prefill token budget that two of the prompts fill: two forwards of two
    prompt = max(backend.prompt_tokens(ask("n", u, s).payload) for u, s, _ in BURST)
    budget, backend.max_prefill_tokens = backend.max_prefill_tokens, 2 * prompt
    try:
        assert await burst(llm, "budget") == (serial, [2, 2])
    finally:
        backend.max_prefill_tokens = budget


async def test_max_num_seqs_bounds_the_batch_and_the_rest_wait_for_a_slot(tmp_path_factory):
    path = trained_chat_model(tmp_path_factory.getbasetemp())
    engine = build_llm_engine(LLMOptions(str(path), max_num_seqs=2))
    assert engine.state.wait_loaded(60), engine.state.load_error  # type: ignore[attr-defined]
    backend = engine.core.backend
    try:
        plan = [*BURST, *BURST[:1]]
        asks = [ask(f"q{i}", user, system) for i, (user, system, _) in enumerate(plan)]
        answers = await asyncio.gather(*(answer(engine, request) for request in asks))
        assert ["".join(deltas) for deltas in answers] == [reply for _, _, reply in plan]
        # never more than two decoding; the others joined as slots freed,
        # each prefilled once
        assert max(backend.step_sizes) == 2
        assert max(backend.prefill_sizes) <= 2 and sum(backend.prefill_sizes) == len(plan)
        assert not backend._active and not backend._waiting
    finally:
        backend.close()


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
