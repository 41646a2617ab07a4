"""What the assistant says back. ``Parrot`` repeats what it heard; an LLM
responder implements the same interface."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from duplex_server.sessions.core.model_port import HistoryItem

if TYPE_CHECKING:
    from duplex_server.engine import EngineRequest
    from duplex_server.models.cascade.model import SpeakPayload

ASK_AGAIN = "Sorry, I did not catch that. Please say it again."


class Responder(Protocol):
    @property
    def loaded(self) -> bool:
        """Whether it can answer now (an LLM's weights load in the background)."""
        ...

    def respond(
        self, history: list[HistoryItem], request: EngineRequest[SpeakPayload]
    ) -> AsyncIterator[str]:
        """The answer to the conversation so far, in pieces as they are ready
        (``request``: the response's ids, epoch and settings)."""
        ...


class Parrot:
    """Repeats the latest user turn; asks again when it heard nothing in it,
    and says nothing at all before the user said anything (a greeting asked
    for with response.create on a new session is an empty answer)."""

    loaded = True

    async def respond(
        self, history: list[HistoryItem], request: EngineRequest[SpeakPayload]
    ) -> AsyncIterator[str]:
        turn = next((item for item in reversed(history) if item.role == "user"), None)
        if turn is None:
            return
        heard = turn.text.strip()
        if not heard:
            yield ASK_AGAIN
            return
        # Whisper punctuates what it hears; PocketSphinx does not.
        yield f"You said: {heard}" + ("" if heard[-1] in ".!?" else ".")
