"""What ``--llm-url`` sends: the chat in the Chat Completions shape, the
session's tool choice as the remote takes it, the pass-through fields, and
the start-up refusals of a remote that is named wrongly."""

from __future__ import annotations

import asyncio

import pytest

from duplex_server import cli
from duplex_server.app import create_app
from duplex_server.engine.llm import ChatPayload, RemoteOptions
from duplex_server.engine.llm.context_window import drop_oldest_turns
from duplex_server.engine.llm.remote import RemoteChatBackend, parse_request_args, wire_messages
from duplex_server.models.cascade.llm_chat import remote_tool_setup, tool_setup
from duplex_server.sessions.core.model_port import SessionView
from protocol.session_config import Tool, ToolChoiceFunction

WEATHER = Tool(type="function", name="get_weather", description="", parameters={})


def view(choice: object) -> SessionView:
    return SessionView(
        instructions="",
        voice="alloy",
        temperature=0.0,
        speed=1.0,
        max_output_tokens="inf",
        tools=[WEATHER],
        tool_choice=choice,  # type: ignore[arg-type]
        chunk_delay_ms=0.0,
    )


def test_a_calls_arguments_go_as_json_text():
    call = {"type": "function", "id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}
    messages = [{"role": "assistant", "content": "", "tool_calls": [call]}]
    wired = wire_messages(messages)
    assert wired[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}  # not changed


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("required", "required"),
        (
            ToolChoiceFunction(type="function", name="get_weather"),
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_the_remote_gets_the_tool_choice_and_no_forced_prefix(choice, expected):
    setup = remote_tool_setup(view(choice))
    assert (setup.tool_choice, setup.answer_prefix) == (expected, "")
    assert [tool["function"]["name"] for tool in setup.tools] == ["get_weather"]
    if choice != "auto":  # in process, the same choice is forced by the answer's start
        assert tool_setup(view(choice)).answer_prefix


def test_none_offers_no_tools():
    assert remote_tool_setup(view("none")).tools == []


def test_request_args_are_json_values_and_keep_their_commas():
    pairs = ["top_k=20", 'chat_template_kwargs={"a":1', '"b":false}', "stop=END"]
    assert parse_request_args(pairs) == (
        ("top_k", 20),
        ("chat_template_kwargs", {"a": 1, "b": False}),
        ("stop", "END"),
    )


@pytest.mark.parametrize("pair", ["model=other", "stream=false", "=3", "novalue"])
def test_request_args_the_server_sets_or_without_a_key_are_refused(pair):
    with pytest.raises(ValueError, match="--llm-request-arg"):
        parse_request_args([pair])


def test_a_chat_too_long_for_the_remote_loses_its_oldest_turns_first():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "3"},
    ]
    payload = ChatPayload(messages, 0.0, 16)
    once = drop_oldest_turns(payload, 1)
    assert once is not None
    assert [m["content"] for m in once.messages] == ["s", "2", "a2", "3"]
    most = drop_oldest_turns(payload, 99)
    assert most is not None and [m["content"] for m in most.messages] == ["s", "3"]
    assert drop_oldest_turns(most, 1) is None  # only the last turn is left


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--llm-url", "http://127.0.0.1:1/v1"], "needs --llm-model"),
        (["--llm-url", "127.0.0.1:1", "--llm-model", "m"], "http:// or https://"),
        (["--llm-url", "http://x/v1", "--llm-model", "m", "--llm", "/tmp"], "choose one"),
        (["--llm-url", "http://x/v1", "--llm-model", "m", "--model", "echo"], "cascade"),
    ],
)
def test_a_remote_named_wrongly_is_refused_at_start(flags, refusal):
    config = cli.serve_config(flags, {})
    with pytest.raises(ValueError, match=refusal):
        create_app(config)


async def test_the_pooled_connections_close_at_shutdown():
    backend = RemoteChatBackend(RemoteOptions(url="http://127.0.0.1:9/v1", model="m"))
    client = backend._http()  # made on this loop, as the first request makes it
    assert not client.is_closed
    await asyncio.to_thread(backend.close)  # as close_model calls it, off the loop
    assert client.is_closed
    await asyncio.to_thread(backend.close)  # a second close is nothing
