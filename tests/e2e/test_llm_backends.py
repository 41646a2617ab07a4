"""The AR path end to end on both backends (``--llm-backend transformers``
and ``vllm``), each behind one real server for the module, answering with
the tiny Qwen2 chat model trained here to known replies
(``duplex_bench.tiny_llm.tiny_qwen_chat_model``): a text conversation and a tool call round trip
through the stock openai SDK, a spoken question answered with the trained
reply (its audio transcribed back), 16 sessions at once, and speech over a
spoken answer that barges in while the answer is still being decoded:
generation is aborted, and nothing of it decoded after the fence reaches
the log or the wire. Answers are compared as whole texts (deltas joined),
never by how they were cut into deltas."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from duplex_bench.tiny_llm import (
    BONJOUR,
    CAPITAL,
    CAPITAL_QUESTIONS,
    COUNT,
    COUNT_QUESTION,
    FOLLOW_UP,
    FRANCE,
    FRANCE_QUESTION,
    FRENCH,
    HELLO,
    LET_ME_CHECK,
    QUESTION,
    WEATHER,
    WEATHER_TOOL,
    trained_qwen_chat_model,
)
from duplex_bench.tiny_llm import call_arguments as weather_arguments
from duplex_server import cli
from duplex_server.audio import resample_pcm16
from tests.conftest import RunningServer, free_port, running_server
from tests.e2e.test_llm_cascade import text_answer
from tests.e2e.test_llm_concurrency import log_lines
from tests.e2e.test_llm_tools import ask, open_session, text_of, until_done
from tests.e2e.test_voice import first, silence, stream_paced, vad_session
from tests.llm_decoding import decoding_of, wait_for
from tests.speech import speak
from tests.vllm_support import SERVE_FLAGS, assert_vllm_installed, requires_vllm
from tests.wsclient import WsClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

BACKENDS = ["transformers", pytest.param("vllm", marks=requires_vllm)]
SESSIONS = 16
# (instructions, question, the trained answer); the sessions cycle through them
PROMPTS = [
    ("", CAPITAL_QUESTIONS[0], CAPITAL),
    ("", "Say hello.", HELLO),
    (FRENCH, "Say hello.", BONJOUR),
    ("", COUNT_QUESTION, COUNT),
]
# The barge-in's answer is held once it has this many tokens ("One, t" of
# its 38): its first clause can be spoken, the rest of the count is not decoded.
HOLD_TOKENS = 4
# an answer's output, in both spellings (the test clients ask for both)
DELTAS = (
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.output_text.delta",
    "response.audio.delta",
    "response.audio_transcript.delta",
    "response.text.delta",
)


@dataclass
class Served:
    backend: str
    server: RunningServer
    unready: list[dict] = field(default_factory=list)  # /ready's answers while it loaded


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def served(request, tmp_path_factory) -> AsyncIterator[Served]:
    """One server per backend for the whole module (vLLM takes tens of
    seconds to start); every session it served refolds to its final state."""
    backend = request.param
    flags = ["--llm-backend", "transformers"]
    if backend == "vllm":
        assert_vllm_installed()
        flags = SERVE_FLAGS
    path = trained_qwen_chat_model(tmp_path_factory.getbasetemp())
    config = cli.serve_config(["--llm", str(path), *flags], {})
    config.port = free_port()
    async with running_server(config) as running, httpx.AsyncClient() as http:
        model = running.app.state.model
        try:
            unready = await wait_ready(http, running.http_url, model)
            yield Served(backend, running, unready)
            await running.assert_replay_determinism()
        finally:
            model.responder.engine.core.backend.close()


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


async def greedy_session(client: AsyncOpenAI, instructions: str, question: str) -> str:
    """One question in a fresh session, answered greedily."""
    async with client.realtime.connect(model="cascade") as connection:
        assert (await connection.recv()).type == "session.created"
        await connection.session.update(session=greedy(instructions=instructions))
        return await text_answer(connection, question)


def greedy(**session: object) -> dict:
    """A session that samples greedily (temperature 0; the default is 0.8),
    so the trained replies come out whole every time."""
    return {"type": "realtime", "temperature": 0.0, **session}


async def greedy_vad_session(server) -> WsClient:
    client = await vad_session(server)
    await client.send({"type": "session.update", "session": {"temperature": 0.0}})
    await client.expect("session.updated")
    return client


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


async def test_a_text_conversation_through_the_openai_sdk(served):
    if served.backend == "vllm":
        # it loaded for tens of seconds, from before the server listened,
        # and /ready said why meanwhile
        assert served.unready
    assert all(answer["reasons"] == ["model_not_loaded"] for answer in served.unready)
    client = AsyncOpenAI(api_key="unused", base_url=f"{served.server.http_url}/v1")
    async with client.realtime.connect(model="cascade") as connection:
        assert (await connection.recv()).type == "session.created"
        await connection.session.update(session=greedy())
        assert await text_answer(connection, CAPITAL_QUESTIONS[0]) == CAPITAL
        # answered only from the turn before it: the chat holds the whole conversation
        assert await text_answer(connection, FRANCE_QUESTION) == FRANCE
    # the session's instructions are the system message
    assert await greedy_session(client, FRENCH, "Say hello.") == BONJOUR


async def test_a_spoken_question_is_answered_with_the_trained_reply(served):
    await assert_spoken_answer(served.server)


async def assert_spoken_answer(server: RunningServer) -> None:
    """A spoken question, heard, answered with the trained reply, whose
    audio the server's own recogniser hears back."""
    client = await greedy_vad_session(server)
    question = "what is the capital of spain"
    await stream_paced(client, silence(500) + speak(question) + silence(1200), chunk_ms=20)
    events = await client.recv_until("response.done", timeout=60)
    await client.close()
    heard = first(events, "conversation.item.input_audio_transcription.completed")
    assert words(heard["transcript"]) == question.split()
    assert events[-1]["response"]["status"] == "completed"
    assert first(events, "response.output_audio_transcript.done")["transcript"] == CAPITAL
    pcm = b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )
    asr = server.app.state.model.listening.asr
    said = await asyncio.to_thread(asr.transcribe, resample_pcm16(pcm, 24_000, 16_000), None, None)
    assert words(said) == words(CAPITAL)


async def test_a_tool_call_round_trip_through_the_openai_sdk(served):
    await assert_tool_round_trip(served.server)


async def assert_tool_round_trip(server: RunningServer) -> None:
    """The trained question calls the weather tool (no markup in the text);
    the client's answer to the call gets the trained follow-up."""
    connection = await open_session(
        server, tools=[WEATHER_TOOL], tool_choice="auto", temperature=0.0
    )
    try:
        events = await ask(connection, QUESTION)
        assert text_of(events) == LET_ME_CHECK  # the call's markup is never text
        response = events[-1].response
        assert response.status == "completed"
        assert [item.type for item in response.output] == ["message", "function_call"]
        call = response.output[1]
        assert (call.name, call.arguments) == ("get_weather", weather_arguments())
        (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert (done.call_id, done.arguments) == (call.call_id, weather_arguments())
        # the client answers the call; the model's follow-up uses the answer
        output = {"type": "function_call_output", "call_id": call.call_id, "output": WEATHER}
        await connection.conversation.item.create(item=output)
        await connection.response.create()
        events = await until_done(connection)
        assert events[-1].response.status == "completed"
        assert text_of(events) == FOLLOW_UP
    finally:
        await connection.close()


async def test_sixteen_concurrent_sessions_get_their_trained_answers(served):
    decoding = decoding_of(served.server)
    try:
        client = AsyncOpenAI(api_key="unused", base_url=f"{served.server.http_url}/v1")
        plan = [PROMPTS[index % len(PROMPTS)] for index in range(SESSIONS)]
        answers = await asyncio.gather(*(greedy_session(client, i, q) for i, q, _ in plan))
        assert answers == [answer for _, _, answer in plan]
        assert decoding.peak > 1  # answers were decoded together, not one after another
    finally:
        decoding.detach()


async def ask_by_text(client, text: str) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await client.send({"type": "conversation.item.create", "item": item})
    await client.send({"type": "response.create"})


async def test_speech_over_the_answer_aborts_it_mid_decode(served):
    server = served.server
    decoding = decoding_of(server)
    client = await greedy_vad_session(server)
    session_id = client.received[0]["session"]["id"]
    try:
        decoding.hold_at(HOLD_TOKENS)
        await ask_by_text(client, COUNT_QUESTION)
        request_id = await decoding.frozen()
        # held in the middle of the answer: the engine is still decoding it
        assert decoding.decoding(request_id) and decoding.unfinished() == 1
        events = await client.recv_until("response.output_audio.delta", timeout=60)
        response_id = events[-1]["response_id"]
        # the user speaks over the answer being spoken; server VAD hears it
        over = speak("what is the capital of spain") + silence(800)
        speech = asyncio.create_task(stream_paced(client, over, chunk_ms=20))
        events += await client.recv_until("response.done", timeout=60)
        done = events[-1]["response"]
        assert done["id"] == response_id
        assert (done["status"], done["duplex"]["reason"]) == ("cancelled", "barge_in")
        # the fence reached the engine while the answer was frozen mid-decode
        await wait_for(lambda: decoding.stopped(request_id), "told to stop")
        at_fence = decoding.decoded(request_id)
        await decoding.release()
        await wait_for(lambda: not decoding.decoding(request_id), "out of the batch")
        assert decoding.decoded(request_id) == at_fence  # no token decoded after it
        await speech
        events += await client.recv_until("response.done", timeout=60)  # the new turn's
    finally:
        decoding.detach()
    # the words over the answer are the next turn, answered from what was
    # heard: the cut answer was never acknowledged as played, so it is not in
    # the chat, and the model answers the last of the two questions
    assert events[-1]["response"]["status"] == "completed"
    assert events[-1]["response"]["id"] != response_id
    (heard,) = [e for e in events if e["type"].endswith("input_audio_transcription.completed")]
    assert words(heard["transcript"]) == words("what is the capital of spain")
    answer = [e for e in events if e["type"] == "response.output_audio_transcript.done"]
    assert answer[-1]["transcript"] == CAPITAL
    await client.close()
    assert decoding.unfinished() == 0

    # on the wire: what was said of the answer is the start of the count, and
    # nothing of it comes after the barge-in
    said = [e for e in events if e["type"] in DELTAS and e.get("response_id") == response_id]
    spoken = "".join(
        e["delta"] for e in said if e["type"] == "response.output_audio_transcript.delta"
    )
    assert spoken.startswith("One,") and COUNT.startswith(spoken) and spoken != COUNT
    decision = first(events, "overlap.decision")
    assert (decision["action"], decision["response_id"]) == ("barge_in", response_id)
    assert all(events.index(event) < events.index(decision) for event in said)
    # in the log: the same words before the fence, nothing of the answer after it
    bodies = [line["body"] for line in await log_lines(server, session_id)]
    fence = next(
        index
        for index, body in enumerate(bodies)
        if isinstance(body, dict) and body.get("kind") == "fence"
    )
    assert bodies[fence]["reason"] == "barge_in"
    logged = [
        (index, body)
        for index, body in enumerate(bodies)
        if isinstance(body, dict)
        and body.get("event_type") in DELTAS
        and body.get("response_id") == response_id
    ]
    assert logged and all(index < fence for index, _ in logged)
    transcript = "".join(
        body.get("text", "")  # (an empty text is left out of the record)
        for _, body in logged
        if body["event_type"] == "response.output_audio_transcript.delta"
    )
    assert transcript == spoken
