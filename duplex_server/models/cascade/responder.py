"""What the assistant says back. ``Parrot`` repeats what it heard; an LLM
responder implements the same interface."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from duplex_server.sessions.items import Item, item_text

ASK_AGAIN = "Sorry, I did not catch that. Please say it again."


class Responder(Protocol):
    def respond(self, history: list[Item]) -> AsyncIterator[str]:
        """The answer to the conversation so far, in pieces as they are ready."""
        ...


class Parrot:
    async def respond(self, history: list[Item]) -> AsyncIterator[str]:
        heard = next((item_text(i) for i in reversed(history) if i.role == "user"), "")
        yield f"You said: {heard}." if heard.strip() else ASK_AGAIN
