"""``--llm PATH``: the cascade answers with a chat model (the tiny one
trained in tests/tiny_chat.py), in text through the stock openai SDK and in
speech through Whisper and eSpeak."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from openai import AsyncOpenAI

from duplex_server import cli
from duplex_server.config import ServerConfig
from duplex_server.engine.llm import vllm_build
from tests.conftest import free_port, running_server
from tests.e2e.test_voice import first, silence, stream_paced, vad_session
from tests.speech import speak
from tests.tiny_chat import BONJOUR, CAPITAL, FRENCH, trained_chat_model


@pytest.fixture
async def llm_server(tmp_path_factory):
    path = trained_chat_model(tmp_path_factory.getbasetemp())
    config = cli.serve_config(["--llm", str(path), "--llm-backend", "auto"], {})
    config.port = free_port()
    async with running_server(config) as running:
        model = running.app.state.model
        while not model.loaded:  # the weights load on the engine's thread
            await asyncio.sleep(0.05)
        yield running
        await running.assert_replay_determinism()


async def text_answer(connection, text: str) -> str:
    await connection.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await connection.response.create(response={"output_modalities": ["text"]})
    deltas = []
    async for event in connection:
        if event.type == "error":
            raise AssertionError(event)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.done":
            assert event.response.status == "completed"
            return "".join(deltas)
    raise AssertionError("the connection ended before response.done")


async def test_a_text_conversation_through_the_openai_sdk(llm_server):
    client = AsyncOpenAI(api_key="unused", base_url=f"{llm_server.http_url}/v1")
    async with client.realtime.connect(model="cascade") as connection:
        assert (await connection.recv()).type == "session.created"
        assert await text_answer(connection, "What is the capital of Spain?") == CAPITAL
    # the session's instructions are the system message
    async with client.realtime.connect(model="cascade") as connection:
        assert (await connection.recv()).type == "session.created"
        await connection.session.update(session={"type": "realtime", "instructions": FRENCH})
        assert await text_answer(connection, "Say hello.") == BONJOUR
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{llm_server.http_url}/ready")).status_code == 200


async def test_a_spoken_question_gets_the_trained_reply_spoken(llm_server):
    client = await vad_session(llm_server)
    question = "what is the capital of spain"
    await stream_paced(client, silence(500) + speak(question) + silence(1200), chunk_ms=20)
    events = await client.recv_until("response.done", timeout=60)
    heard = first(events, "conversation.item.input_audio_transcription.completed")
    assert re.findall(r"[a-z]+", heard["transcript"].lower()) == question.split()
    assert first(events, "response.output_audio_transcript.done")["transcript"] == CAPITAL
    audio = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert audio and events[-1]["response"]["status"] == "completed"


@pytest.mark.skipif(
    vllm_build() is not None,
    reason="vLLM is installed here: tests/e2e/test_vllm_cascade.py checks its refusals",
)
def test_vllm_is_refused_by_name(tmp_path):
    config = cli.serve_config(["--llm", str(tmp_path), "--llm-backend", "vllm"], {})
    assert (config.llm, config.llm_backend) == (str(tmp_path), "vllm")
    from duplex_server.app import create_app

    with pytest.raises(ValueError, match="vLLM is not installed"):
        create_app(ServerConfig(port=free_port(), llm=str(tmp_path), llm_backend="vllm"))
