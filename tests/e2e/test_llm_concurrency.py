"""The transformers backend behind the real server under load: many text
sessions answered at once, batched into shared decode steps; and a
``response.cancel`` in the middle of an answer fences it (no token decoded
after the fence reaches the session's log, and the request leaves the
backend's decode batch)."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from openai import AsyncOpenAI

from duplex_bench.tiny_llm import BONJOUR, CAPITAL, FRENCH, HELLO, trained_chat_model
from duplex_server import cli
from tests.conftest import free_port, running_server
from tests.e2e.test_llm_cascade import text_answer
from tests.e2e.test_voice import client_commit_session

SESSIONS = 16
# (instructions, question, the trained answer), sessions cycle through them
PROMPTS = [
    ("", "What is the capital of Spain?", CAPITAL),
    ("", "Say hello.", HELLO),
    (FRENCH, "Say hello.", BONJOUR),
]


@pytest.fixture
async def llm_server(tmp_path_factory):
    path = trained_chat_model(tmp_path_factory.getbasetemp())
    config = cli.serve_config(["--llm", str(path), "--llm-backend", "transformers"], {})
    config.port = free_port()
    async with running_server(config) as running:
        while not running.app.state.model.loaded:  # the weights load on the engine's thread
            await asyncio.sleep(0.05)
        yield running
        await running.assert_replay_determinism()


def backend_of(server):
    return server.app.state.model.responder.engine.backend


async def one_session(client: AsyncOpenAI, instructions: str, question: str) -> str:
    async with client.realtime.connect(model="cascade") as connection:
        assert (await connection.recv()).type == "session.created"
        if instructions:
            await connection.session.update(
                session={"type": "realtime", "instructions": instructions}
            )
        return await text_answer(connection, question)


async def test_sixteen_concurrent_sessions_get_their_answers_from_shared_steps(llm_server):
    backend = backend_of(llm_server)
    steps_before = len(backend.step_sizes)
    client = AsyncOpenAI(api_key="unused", base_url=f"{llm_server.http_url}/v1")
    plan = [PROMPTS[index % len(PROMPTS)] for index in range(SESSIONS)]
    answers = await asyncio.gather(*(one_session(client, i, q) for i, q, _ in plan))
    assert answers == [answer for _, _, answer in plan]
    sizes = backend.step_sizes[steps_before:]
    # one forward advanced several sessions' answers at once
    assert max(sizes) > 1, sizes
    # every answer's tokens came from the batch: fewer forwards than tokens
    assert len(sizes) < sum(len(answer) for _, _, answer in plan)


async def log_lines(server, session_id: str) -> list[dict]:
    async with httpx.AsyncClient() as http:
        reply = await http.get(f"{server.http_url}/v1/sessions/{session_id}/events")
    assert reply.status_code == 200
    return [json.loads(line) for line in reply.text.splitlines() if line]


async def test_a_cancel_mid_answer_fences_the_tokens_after_it(llm_server):
    backend = backend_of(llm_server)
    client = await client_commit_session(llm_server)
    session_id = client.received[0]["session"]["id"]
    # "Hello, friend!": text streams token by token, so the first delta
    # ("H") leaves mid-answer
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Say hello."}],
    }
    await client.send({"type": "conversation.item.create", "item": item})
    await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    # Hold the decode thread once "Hello, f" is decoded (it then waits
    # between forwards, as if the machine were slow), so the cancel lands in
    # the middle of the answer whatever this machine's speed.
    resume, stepped = threading.Event(), threading.Event()
    step = backend._step

    def step_then_wait() -> None:
        step()
        if any(len(active.generated) >= len("Hello, f") for active in backend._active):
            stepped.set()
            resume.wait(60)

    backend._step = step_then_wait
    try:
        await asyncio.to_thread(stepped.wait, 60)
        request_ids = {active.request_id for active in backend._active}
        assert len(request_ids) == 1
        events = await client.recv_until("response.output_text.delta", timeout=60)
        await client.send({"type": "response.cancel"})
        events += await client.recv_until("response.done", timeout=60)
    finally:
        backend._step = step
        resume.set()
    done = events[-1]["response"]
    assert done["status"] == "cancelled"
    heard = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert heard and HELLO.startswith(heard) and heard != HELLO
    # the decode batch drops it before its next forward
    steps = backend.steps
    while backend.steps == steps and backend._active:
        await asyncio.sleep(0.01)
    assert not request_ids & {active.request_id for active in backend._active}
    # nothing after the fence reached the log: its deltas are the ones the
    # client got before response.done, and nothing of it follows
    await asyncio.sleep(0.2)
    lines = await log_lines(llm_server, session_id)
    # (each event the session sent is an "out" record: its type and text)
    sent = [line["body"] for line in lines if isinstance(line["body"], dict)]
    logged = [body for body in sent if body.get("event_type") == "response.output_text.delta"]
    assert "".join(body["text"] for body in logged) == heard
    order = [body.get("event_type") for body in sent]
    done_at = order.index("response.done")
    assert "response.output_text.delta" not in order[done_at:]
    # the session goes on serving: the next answer completes (its chat now
    # holds the cut-off turn, which the tiny model was not trained on, so
    # its words are not known)
    await client.send({"type": "conversation.item.create", "item": item})
    await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    again = await client.recv_until("response.done", timeout=60)
    assert again[-1]["response"]["status"] == "completed"
