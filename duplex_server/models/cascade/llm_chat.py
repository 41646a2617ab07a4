"""The conversation as a chat model's messages, in the chat-template shape
that Hugging Face templates (and vLLM's) take.

User turns are their text or transcript; assistant turns are what counts in
history (``HistoryItem.text``: as far as played and acknowledged); a
``function_call`` item joins the assistant message of its response as one
of its ``tool_calls``; a ``function_call_output`` is a ``tool`` message.
The session's ``tools`` go to the template as function schemas, and
``tool_choice`` decides what the model is offered and how its answer starts
(:func:`tool_setup`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from duplex_server.engine.llm.tool_call_parser import OPEN
from duplex_server.sessions.core.model_port import HistoryItem, SessionView
from protocol.session_config import Tool, ToolChoiceFunction

_ROLES = ("user", "assistant", "system")


@dataclass(frozen=True)
class ToolSetup:
    """What the template gets for the session's tools, and the text the
    answer is made to begin with (the model continues from it): ``required``
    opens a tool call, a named function opens a call of that function."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    answer_prefix: str = ""
    tool_choice: str | dict[str, Any] = "auto"  # a remote's (Chat Completions)


def tool_setup(config: SessionView) -> ToolSetup:
    """``tool_choice``: ``none`` offers no tools, ``auto`` offers them all,
    ``required`` offers them all and starts the answer with ``<tool_call>``,
    a named function offers that one and starts the call to it, so the model
    can only fill in the arguments. (The forced start is the Hermes format
    the answer is parsed in.)"""
    choice, tools = config.tool_choice, config.tools
    if choice == "none" or not tools:
        return ToolSetup()
    if isinstance(choice, ToolChoiceFunction):
        name = choice.function_name()
        named = [tool for tool in tools if tool.name == name]
        prefix = f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": '
        return ToolSetup([template_tool(tool) for tool in named], prefix)
    schemas = [template_tool(tool) for tool in tools]
    return ToolSetup(schemas, f'{OPEN}\n{{"name": "' if choice == "required" else "")


def remote_tool_setup(config: SessionView) -> ToolSetup:
    """The same choice for a remote that takes Chat Completions' own
    ``tool_choice`` (``auto``, ``required`` or the function by name)
    and forces the call itself: no answer prefix."""
    choice, tools = config.tool_choice, config.tools
    if choice == "none" or not tools:
        return ToolSetup()
    schemas = [template_tool(tool) for tool in tools]
    if isinstance(choice, ToolChoiceFunction):
        named = {"type": "function", "function": {"name": choice.function_name()}}
        return ToolSetup(schemas, tool_choice=named)
    return ToolSetup(schemas, tool_choice=str(choice))


def template_tool(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def chat_messages(history: list[HistoryItem], instructions: str) -> list[dict[str, Any]]:
    """The session's messages in order, the instructions as the system
    message first. Empty turns (an answer nobody heard) are left out; a
    call stays in its turn whether or not it was answered (the template
    shows the model which calls got no output)."""
    messages: list[dict[str, Any]] = (
        [{"role": "system", "content": instructions}] if instructions.strip() else []
    )
    for item in history:
        if item.kind == "message" and item.role in _ROLES and item.text.strip():
            messages.append({"role": item.role, "content": item.text.strip()})
        elif item.kind == "function_call" and item.name:
            _assistant_turn(messages).setdefault("tool_calls", []).append(_tool_call(item))
        elif item.kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": item.output or ""}
            )
    return messages


def _assistant_turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message a call belongs to: the one just before it, or
    a new empty one (its spoken part was not heard, or there was none)."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def _tool_call(item: HistoryItem) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(item.arguments or "{}")
    except json.JSONDecodeError:
        arguments = item.arguments  # a client-restored call may carry any text
    return {
        "type": "function",
        "id": item.call_id,
        "function": {"name": item.name, "arguments": arguments},
    }


def has_question(messages: list[dict[str, Any]]) -> bool:
    """Something to answer: a user turn or a tool's output."""
    return any(message["role"] in ("user", "tool") for message in messages)
