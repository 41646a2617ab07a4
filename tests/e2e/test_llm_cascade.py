"""``--llm PATH``: the cascade answers with a chat model (the tiny one
trained in ``duplex_bench.tiny_llm``), in text through the stock openai SDK and in
speech through Whisper and eSpeak."""

from __future__ import annotations

import re

import httpx
import pytest
from openai import AsyncOpenAI

from duplex_bench.tiny_llm import BONJOUR, CAPITAL, FRENCH, HELLO, trained_chat_model
from duplex_server import cli
from duplex_server.config import ServerConfig
from duplex_server.engine.llm import vllm_build
from tests.conftest import free_port, serving_llm
from tests.e2e.test_voice import (
    client_commit_session,
    first,
    silence,
    stream_paced,
    vad_session,
)
from tests.speech import speak


@pytest.fixture
async def llm_server(tmp_path_factory):
    path = trained_chat_model(tmp_path_factory.getbasetemp())
    async with serving_llm("--llm", str(path), "--llm-backend", "auto") as running:
        yield running


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


def capture_chats(server, payloads: list | None = None) -> list[list[dict]]:
    """The chats the engine is asked to answer (its submit, passed through);
    ``payloads`` gets the whole requests' payloads."""
    core = server.app.state.model.responder.engine.core
    submit, chats = core.submit, []

    def recording(request):
        chats.append(request.payload.messages)
        if payloads is not None:
            payloads.append(request.payload)
        return submit(request)

    core.submit = recording
    return chats


async def say(client, text: str, **response) -> list[dict]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await client.send({"type": "conversation.item.create", "item": item})
    await client.send({"type": "response.create", "response": response})
    events = await client.recv_until("rate_limits.updated", timeout=60)
    return events[:-1]  # up to its response.done


async def test_the_next_answer_hears_only_what_was_played_and_acknowledged(llm_server):
    chats = capture_chats(llm_server)
    client = await client_commit_session(llm_server)
    events = await say(client, "Say hello.")
    assert first(events, "response.output_audio_transcript.done")["transcript"] == HELLO
    done = events[-1]["response"]
    # the client acknowledges the first chunk's playback: its words count,
    # the rest (generated, never acknowledged) does not
    audio = [e for e in events if e["type"] == "response.output_audio.delta"]
    (mark,) = audio[0]["metadata"]["audio_text_marks"]
    await client.send(
        {"type": "playback.ack", "response_id": done["id"], "played_ms": mark["audio_end_ms"]}
    )
    await client.recv_until("playback.acknowledged")
    heard = HELLO[: mark["text_chars"]].strip()
    assert heard and heard != HELLO
    await say(client, "Say hello.", output_modalities=["text"])
    assert chats[-1][:2] == [
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": heard},
    ]
    # a truncation cuts it further, for good
    await client.send(
        {
            "type": "conversation.item.truncate",
            "item_id": done["output"][0]["id"],
            "content_index": 0,
            "audio_end_ms": 0,
        }
    )
    await client.recv_until("conversation.item.truncated")
    await say(client, "Say hello.", output_modalities=["text"])
    assert [m["role"] for m in chats[-1][:2]] == ["user", "user"]


async def test_per_response_overrides_reach_the_model(llm_server):
    payloads: list = []
    capture_chats(llm_server, payloads)
    client = await client_commit_session(llm_server)
    events = await say(
        client, "Say hello.", output_modalities=["text"], instructions=FRENCH, temperature=0.0
    )
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == BONJOUR
    assert payloads[-1].messages[0] == {"role": "system", "content": FRENCH}
    assert payloads[-1].temperature == 0.0  # the session's is 0.8
    # max_output_tokens caps the answer (one character a token)
    client = await client_commit_session(llm_server)
    events = await say(
        client, "What is the capital of Spain?", output_modalities=["text"], max_output_tokens=3
    )
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == CAPITAL[:3]


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
