"""The LLM responder's pure parts: the chat built from the history (honest
assistant turns, tool calls and outputs in the template's shape), the tool
setup per ``tool_choice``, the Hermes tool-call parser over any split of
the stream, and dropping old turns to fit the context window."""

from __future__ import annotations

import json

import pytest

from duplex_server.engine.llm import ChatPayload
from duplex_server.engine.llm.context_window import fit_chat
from duplex_server.engine.llm.tool_call_parser import (
    MalformedToolCall,
    ParsedToolCall,
    ToolCallParser,
)
from duplex_server.models.cascade.llm_chat import chat_messages, tool_setup
from duplex_server.sessions.core.config import check_tool_choice
from duplex_server.sessions.core.items import Item, Part
from duplex_server.sessions.core.model_port import HistoryItem, SessionView, history_view
from protocol.errors import ProtocolError
from protocol.session_config import Tool, ToolChoiceFunction

WEATHER = Tool(name="get_weather", description="d", parameters={"type": "object"})
CLOCK = Tool(name="get_time")


def view(tools=(), choice="auto") -> SessionView:
    return SessionView("", "alloy", 1.0, 0.8, "inf", list(tools), choice, 0.0)


def test_an_assistant_answer_counts_as_far_as_it_was_acknowledged():
    spoken = Item(
        id="a",
        role="assistant",
        parts=[Part(type="audio", transcript="Hello there. How are you?")],
        marks=[(500.0, 13), (1000.0, 25)],
        history_ms=600.0,
    )
    unheard = Item(id="b", role="assistant", parts=[Part(type="audio", transcript="More.")])
    unheard.history_ms, unheard.marks = 0.0, [(300.0, 5)]
    typed = Item(id="c", role="assistant", parts=[Part(type="text", text="Typed answer.")])
    typed.history_ms = 0.0  # a text answer is delivered whole
    texts = [item.text for item in history_view([spoken, unheard, typed])]
    assert texts == ["Hello there. ", "", "Typed answer."]


def test_tool_calls_and_outputs_take_the_template_shape():
    history = [
        HistoryItem("u", "message", "user", "Weather?"),
        HistoryItem("a", "message", "assistant", "Let me check."),
        HistoryItem(
            "c",
            "function_call",
            None,
            "",
            call_id="c1",
            name="get_weather",
            arguments='{"city": "P"}',
        ),
        HistoryItem("o", "function_call_output", None, "", call_id="c1", output="Sunny"),
        HistoryItem("x", "function_call", None, "", call_id="c2", name="get_time", arguments="{}"),
    ]
    assert chat_messages(history, "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "type": "function",
                    "id": "c1",
                    "function": {"name": "get_weather", "arguments": {"city": "P"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "id": "c2", "function": {"name": "get_time", "arguments": {}}}
            ],
        },
    ]


def test_tool_choice_decides_the_tools_offered_and_the_answers_start():
    assert tool_setup(view([WEATHER], "none")).tools == []
    auto = tool_setup(view([WEATHER, CLOCK], "auto"))
    assert [t["function"]["name"] for t in auto.tools] == ["get_weather", "get_time"]
    assert auto.answer_prefix == ""
    assert tool_setup(view([WEATHER], "required")).answer_prefix == '<tool_call>\n{"name": "'
    named = tool_setup(view([WEATHER, CLOCK], ToolChoiceFunction(type="function", name="get_time")))
    assert [t["function"]["name"] for t in named.tools] == ["get_time"]
    assert named.answer_prefix == '<tool_call>\n{"name": "get_time", "arguments": '


ANSWER = 'Let me check.<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call> Done.'


@pytest.mark.parametrize("size", [1, 2, 3, 5, 11, 200])
def test_the_parser_finds_the_call_however_the_stream_is_split(size):
    parser = ToolCallParser()
    pieces = []
    for at in range(0, len(ANSWER), size):
        pieces += parser.feed(ANSWER[at : at + size])
    pieces += parser.finish()
    text = "".join(piece for piece in pieces if isinstance(piece, str))
    calls = [piece for piece in pieces if not isinstance(piece, str)]
    assert text == "Let me check. Done."
    assert calls == [ParsedToolCall("f", json.dumps({"x": 1}))]
    assert not any("<" in piece for piece in pieces if isinstance(piece, str))


def test_the_parser_keeps_what_only_looked_like_a_tag_and_reports_bad_calls():
    parser = ToolCallParser()
    assert parser.feed("a <tool") == ["a "]
    assert parser.feed("s> b") == ["<tools> b"]
    unclosed = ToolCallParser()
    unclosed.feed('<tool_call>{"name": "f", "arguments": {}}')
    assert unclosed.finish() == [ParsedToolCall("f", "{}")]
    broken = ToolCallParser().feed('<tool_call>{"name": </tool_call>')
    assert isinstance(broken[0], MalformedToolCall) and "not JSON" in broken[0].reason
    nameless = ToolCallParser().feed('<tool_call>{"arguments": {}}</tool_call>')
    assert isinstance(nameless[0], MalformedToolCall)


def test_a_long_chat_loses_whole_old_turns_first():
    turns = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1" * 10},
        {"role": "assistant", "content": "a1" * 10},
        {"role": "user", "content": "u2" * 10},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "t" * 20},
        {"role": "user", "content": "u3"},
    ]
    payload = ChatPayload(turns, 0.0, max_new_tokens=10)

    def count(chat: ChatPayload) -> int:  # one token a character
        return sum(len(str(message["content"])) for message in chat.messages)

    assert fit_chat(payload, count, 1000) == (payload, 0)
    fitted, dropped = fit_chat(payload, count, 10 + 1 + 20 + 20 + 2)
    assert dropped == 2 and fitted.messages == [turns[0], *turns[3:]]
    fitted, dropped = fit_chat(payload, count, 10 + 3)
    assert dropped == 5 and fitted.messages == [turns[0], turns[-1]]
    # a token cap as large as the window leaves the prompt half of it
    greedy = ChatPayload(turns, 0.0, max_new_tokens=1000)
    fitted, dropped = fit_chat(greedy, count, 2 * (1 + 20 + 20 + 2))
    assert dropped == 2 and fitted.messages == [turns[0], *turns[3:]]


def test_required_without_tools_is_refused():
    with pytest.raises(ProtocolError) as refused:
        check_tool_choice("required", [], "session.tool_choice")
    assert (refused.value.code, refused.value.param) == ("invalid_value", "session.tool_choice")
    check_tool_choice("required", [WEATHER], "session.tool_choice")
