"""A chat longer than the model's window loses its oldest turns, never the
answer: the system message stays, whole turns go from the front (a turn
runs from one user message to the next, so a tool call and its output leave
together) until the prompt and room for the answer fit: the answer's token
cap, but never more than half the window (a cap as large as the window must
not leave the prompt no room; the answer then stops where the window ends).
The last turn always stays; the backend cuts a prompt that is still too long
from its start as a last resort."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from duplex_server.engine.llm.interface import ChatPayload


def fit_chat(
    payload: ChatPayload, prompt_tokens: Callable[[ChatPayload], int], window: int
) -> tuple[ChatPayload, int]:
    """``payload`` with as few of its oldest turns dropped as make it fit
    (its prompt plus ``max_new_tokens`` within ``window``); the number of
    messages dropped. Blocking (it renders and tokenizes): call it off the
    event loop."""
    budget = prompt_budget(window, payload.max_new_tokens)
    if prompt_tokens(payload) <= budget:
        return payload, 0
    head, starts = _droppable(payload.messages)
    # Binary search for the fewest turns to drop: fewer messages, fewer tokens.
    low, high = 1, len(starts)
    while low < high:
        middle = (low + high) // 2
        if prompt_tokens(_without(payload, head, starts[middle - 1])) <= budget:
            high = middle
        else:
            low = middle + 1
    if not starts:
        return payload, 0
    cut = starts[low - 1]
    return _without(payload, head, cut), cut - head


def prompt_budget(window: int, max_new_tokens: int) -> int:
    """The most prompt tokens that leave the answer its room."""
    return window - min(max_new_tokens, window // 2)


def _droppable(messages: list[dict[str, object]]) -> tuple[int, list[int]]:
    """How many messages lead and always stay (the system message), and
    where each turn but the first starts: cutting at one drops the turns
    before it."""
    head = 1 if messages and messages[0]["role"] == "system" else 0
    starts = [index for index in range(head + 1, len(messages)) if _starts_turn(messages[index])]
    return head, starts


def _starts_turn(message: dict[str, object]) -> bool:
    return message["role"] == "user"


def _without(payload: ChatPayload, head: int, cut: int) -> ChatPayload:
    messages = payload.messages[:head] + payload.messages[cut:]
    return dataclasses.replace(payload, messages=messages)


def drop_oldest_turns(payload: ChatPayload, turns: int) -> ChatPayload | None:
    """``payload`` without its ``turns`` oldest turns (the system message
    and the last turn stay), for a backend that cannot count tokens and
    learns from the remote's refusal that the chat is too long; None when
    only the last turn is left."""
    head, starts = _droppable(payload.messages)
    if not starts:
        return None
    return _without(payload, head, starts[min(turns, len(starts)) - 1])
