"""Tools through ``--llm``: the tiny tool model (``duplex_bench.tiny_llm``)
calls ``get_weather`` through the stock openai SDK, the client answers the
call, and the model's follow-up uses the answer; ``tool_choice`` decides
what the model may do; a malformed call ends in ``engine_error``."""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI

from duplex_bench.tiny_llm import (
    BROKEN,
    FOLLOW_UP,
    LET_ME_CHECK,
    NO_TOOLS,
    QUESTION,
    ROME,
    WEATHER,
    WEATHER_TOOL,
    call_arguments,
    trained_tool_model,
)
from tests.conftest import serving_llm


@pytest.fixture
async def tool_server(tmp_path_factory):
    path = trained_tool_model(tmp_path_factory.getbasetemp())
    async with serving_llm("--llm", str(path), "--llm-max-new-tokens", "120") as running:
        yield running


async def open_session(server, **session):
    client = AsyncOpenAI(api_key="unused", base_url=f"{server.http_url}/v1")
    connection = await client.realtime.connect(model="cascade").enter()
    assert (await connection.recv()).type == "session.created"
    update = {"type": "realtime", "output_modalities": ["text"], **session}
    await connection.session.update(session=update)
    return connection


async def ask(connection, text: str, **response) -> list:
    await connection.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await connection.response.create(**({"response": response} if response else {}))
    return await until_done(connection)


async def until_done(connection) -> list:
    events = []
    async for event in connection:
        events.append(event)
        if event.type == "response.done":
            return events
    raise AssertionError("the connection ended before response.done")


def text_of(events) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def of_type(events, kind: str) -> list:
    return [event for event in events if event.type == kind]


async def test_a_tool_call_round_trip_through_the_openai_sdk(tool_server):
    connection = await open_session(tool_server, tools=[WEATHER_TOOL], tool_choice="auto")
    try:
        events = await ask(connection, QUESTION)
        # the text before the call is streamed; the markup never is
        assert text_of(events) == LET_ME_CHECK
        assert not any(
            "<tool_call>" in json.dumps(e.model_dump())
            for e in of_type(events, "response.output_text.delta")
        )
        (delta,) = of_type(events, "response.function_call_arguments.delta")
        (done,) = of_type(events, "response.function_call_arguments.done")
        assert (done.name, done.arguments, delta.delta) == (
            "get_weather",
            call_arguments(),
            call_arguments(),
        )
        response = events[-1].response
        assert response.status == "completed"
        assert [item.type for item in response.output] == ["message", "function_call"]
        call = response.output[1]
        assert (call.call_id, call.name, call.arguments) == (
            done.call_id,
            "get_weather",
            call_arguments(),
        )

        # the client answers the call and asks for the follow-up
        output = {"type": "function_call_output", "call_id": call.call_id, "output": WEATHER}
        await connection.conversation.item.create(item=output)
        await connection.response.create()
        events = await until_done(connection)
        assert text_of(events) == FOLLOW_UP
        assert events[-1].response.status == "completed"

        # the ledger: a second answer, or one to a call nobody made, is refused
        await connection.conversation.item.create(item=output, event_id="again")
        await connection.conversation.item.create(
            item={**output, "call_id": "call_nobody"}, event_id="nobody"
        )
        codes = []
        async for event in connection:
            if event.type == "error":
                codes.append((event.error.event_id, event.error.code))
            if len(codes) == 2:
                break
        assert codes == [
            ("again", "duplicate_function_call_output"),
            ("nobody", "unknown_function_call"),
        ]
    finally:
        await connection.close()


async def test_tool_choice_none_offers_no_tools(tool_server):
    connection = await open_session(tool_server, tools=[WEATHER_TOOL], tool_choice="auto")
    try:
        events = await ask(connection, QUESTION, tool_choice="none")
        assert text_of(events) == NO_TOOLS
        assert not of_type(events, "response.function_call_arguments.done")
    finally:
        await connection.close()


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
async def test_required_or_named_tool_choice_makes_the_call(tool_server, choice):
    connection = await open_session(tool_server, tools=[WEATHER_TOOL], tool_choice=choice)
    try:
        events = await ask(connection, ROME)
        (done,) = of_type(events, "response.function_call_arguments.done")
        assert (done.name, json.loads(done.arguments)) == ("get_weather", {"city": "Rome"})
        assert text_of(events) == ""
    finally:
        await connection.close()


async def test_a_malformed_tool_call_is_an_engine_error(tool_server):
    connection = await open_session(tool_server, tools=[WEATHER_TOOL])
    try:
        await connection.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": BROKEN}],
            }
        )
        await connection.response.create()
        events = await until_done(connection)
        (error,) = of_type(events, "error")
        assert error.error.code == "engine_error"
        assert "tool call" in error.error.message and "get_weather" in error.error.message
        assert events[-1].response.status == "failed"
        assert not of_type(events, "response.function_call_arguments.done")
        # the session goes on: with the broken turn deleted, the next
        # question gets the trained answer
        for item_id in {e.item.id for e in of_type(events, "conversation.item.added")}:
            await connection.conversation.item.delete(item_id=item_id)
        events = await ask(connection, QUESTION, tool_choice="none")
        assert text_of(events) == NO_TOOLS
    finally:
        await connection.close()


async def test_a_spoken_answer_says_the_text_before_the_call_and_never_the_markup(tool_server):
    connection = await open_session(tool_server, tools=[WEATHER_TOOL], output_modalities=["audio"])
    try:
        events = await ask(connection, QUESTION)
        transcript = "".join(
            e.delta for e in events if e.type == "response.output_audio_transcript.delta"
        )
        assert transcript == LET_ME_CHECK
        assert of_type(events, "response.output_audio.delta")
        (done,) = of_type(events, "response.function_call_arguments.done")
        assert (done.name, done.arguments) == ("get_weather", call_arguments())
        response = events[-1].response
        assert response.status == "completed"
        assert [item.type for item in response.output] == ["message", "function_call"]
        # the token figures and the synthesis time, journaled with the answer
        stages = response.model_extra["duplex"]["stage_metrics"]
        assert {"llm_ttft_ms", "llm_tpot_ms", "tts_first_clause_ms"} <= set(stages)
    finally:
        await connection.close()
