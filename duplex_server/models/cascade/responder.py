"""What the assistant says back. ``Parrot`` repeats what it heard; an LLM
responder implements the same interface."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from duplex_server.sessions.core.model_port import FunctionCallPart, HistoryItem

if TYPE_CHECKING:
    from duplex_server.engine import EngineRequest
    from duplex_server.models.cascade.payload import SpeakPayload

ASK_AGAIN = "Sorry, I did not catch that. Please say it again."


@dataclass(frozen=True)
class StageTimes:
    """Figures the responder measured (ms, or counts), reported with the
    response's stage metrics."""

    stage_ms: dict[str, float]


# What a responder hands on: text to say, a tool call, or stage figures.
Reply = str | FunctionCallPart | StageTimes


class Responder(Protocol):
    @property
    def loaded(self) -> bool:
        """Whether it can answer now (an LLM's weights load in the background)."""
        ...

    def respond(
        self, history: list[HistoryItem], request: EngineRequest[SpeakPayload]
    ) -> AsyncIterator[Reply]:
        """The answer to the conversation so far, in pieces as they are ready
        (``request``: the response's ids, epoch and settings)."""
        ...

    def close(self) -> None:
        """Stop what it runs (an LLM's decode thread), at server shutdown."""
        ...

    async def unreachable(self) -> str | None:
        """Why it cannot answer now (a remote LLM that does not answer), or None."""
        ...


class Parrot:
    """Repeats the latest user turn; asks again when it heard nothing in it,
    and says nothing at all before the user said anything (a greeting asked
    for with response.create on a new session is an empty answer)."""

    loaded = True

    def close(self) -> None:
        pass

    async def unreachable(self) -> str | None:
        return None

    async def respond(
        self, history: list[HistoryItem], request: EngineRequest[SpeakPayload]
    ) -> AsyncIterator[Reply]:
        turn = next((item for item in reversed(history) if item.role == "user"), None)
        if turn is None:
            return
        heard = turn.text.strip()
        if not heard:
            yield ASK_AGAIN
            return
        # Whisper punctuates what it hears; PocketSphinx does not.
        yield f"You said: {heard}" + ("" if heard[-1] in ".!?" else ".")
