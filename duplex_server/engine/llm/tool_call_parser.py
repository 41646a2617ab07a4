"""Tool calls in a chat model's streamed text, in the Hermes format that
Qwen, Hermes and most open chat templates use::

    Let me check.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The parser takes the answer delta by delta and hands back what is plain
text (to be spoken or streamed) apart from the calls, so no tool-call markup
ever reaches speech: text that might be the start of ``<tool_call>`` is held
back until the next delta says whether it is. A call whose body is not
``{"name": str, "arguments": object}`` JSON is a :class:`MalformedToolCall`,
carrying its raw text, so the caller can keep it and say what went wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # a JSON object, as text


@dataclass(frozen=True)
class MalformedToolCall:
    raw: str  # the markup as the model wrote it
    reason: str


Piece = str | ParsedToolCall | MalformedToolCall


class ToolCallParser:
    """Splits a streamed answer into text and tool calls, in order."""

    def __init__(self) -> None:
        self._pending = ""  # text not yet handed back (a possible tag start, or a call's body)
        self._in_call = False

    def feed(self, delta: str) -> list[Piece]:
        self._pending += delta
        pieces: list[Piece] = []
        while True:
            if self._in_call:
                end = self._pending.find(CLOSE)
                if end < 0:
                    return pieces
                pieces.append(parse_call(self._pending[:end]))
                self._pending = self._pending[end + len(CLOSE) :]
                self._in_call = False
                continue
            start = self._pending.find(OPEN)
            if start >= 0:
                if start:
                    pieces.append(self._pending[:start])
                self._pending = self._pending[start + len(OPEN) :]
                self._in_call = True
                continue
            keep = _partial_tag_length(self._pending)
            text = self._pending[: len(self._pending) - keep]
            if text:
                pieces.append(text)
            self._pending = self._pending[len(text) :]
            return pieces

    def finish(self) -> list[Piece]:
        """What is left when the answer ends: an unclosed call is parsed as
        it stands (models often stop right after the JSON), a held-back
        partial tag is plain text after all."""
        rest, self._pending = self._pending, ""
        if self._in_call:
            self._in_call = False
            return [parse_call(rest)]
        return [rest] if rest else []


def parse_call(body: str) -> ParsedToolCall | MalformedToolCall:
    raw = f"{OPEN}{body}{CLOSE}"
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return MalformedToolCall(raw, f"not JSON ({exc})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return MalformedToolCall(raw, 'not an object with a string "name"')
    return checked_call(call["name"], call.get("arguments", {}), raw)


def checked_call(name: str, arguments: object, raw: str) -> ParsedToolCall | MalformedToolCall:
    """A call whose arguments are a JSON object (or its text); ``raw`` is
    what is quoted when they are not."""
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return MalformedToolCall(raw, f"arguments are not JSON ({exc})")
    if not isinstance(arguments, dict):
        return MalformedToolCall(raw, '"arguments" is not an object')
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


def _partial_tag_length(text: str) -> int:
    """How many trailing characters of ``text`` could begin ``<tool_call>``."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0
