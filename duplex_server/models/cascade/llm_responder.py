"""The cascade's LLM responder: the conversation as a chat, answered by the
AR engine, handed to speech clause by clause as the tokens decode."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

from duplex_server.engine import EngineRequest
from duplex_server.engine.llm import ChatPayload, LLMEngine
from duplex_server.sessions.core.model_port import HistoryItem

if TYPE_CHECKING:
    from duplex_server.models.cascade.model import SpeakPayload

# Where a clause ends in decoded text: a mark followed by a space (the
# cascade's own clause rule), so a piece handed on is a whole clause.
_CLAUSE_END = re.compile(r"[.!?,;:]\s")
_ROLES = ("user", "assistant", "system")


def chat_messages(history: list[HistoryItem], instructions: str) -> list[dict[str, str]]:
    """The session's messages in order (user turns by their text or
    transcript, assistant turns as far as they were played), the
    instructions as the system message first. Tool items wait for tools."""
    messages = [{"role": "system", "content": instructions}] if instructions.strip() else []
    for item in history:
        if item.kind == "message" and item.role in _ROLES and item.text.strip():
            messages.append({"role": item.role, "content": item.text.strip()})
    return messages


class LLMResponder:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    @property
    def loaded(self) -> bool:
        return self.engine.state.loaded

    async def respond(
        self, history: list[HistoryItem], request: EngineRequest[SpeakPayload]
    ) -> AsyncIterator[str]:
        payload = request.payload
        messages = chat_messages(history, payload.instructions)
        if not any(message["role"] == "user" for message in messages):
            return  # nothing said to answer yet (a greeting on a new session)
        cap = self.engine.max_new_tokens
        if isinstance(payload.max_output_tokens, int):
            cap = min(cap, payload.max_output_tokens)
        chat = EngineRequest(
            request_id=request.request_id,
            session_id=request.session_id,
            response_id=request.response_id,
            epoch=request.epoch,
            payload=ChatPayload(messages, payload.temperature, cap),
            priority=request.priority,
        )
        stream = self.engine.core.submit(chat)
        pending = ""
        try:
            async for delta in stream:
                pending += delta
                end = _last_clause_end(pending)
                if end:
                    yield pending[:end]
                    pending = pending[end:]
            if pending.strip():
                yield pending
        finally:
            # An answer abandoned (cancel, barge-in) stops decoding now.
            self.engine.core.abort(chat.request_id)
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()


def _last_clause_end(text: str) -> int:
    ends = [match.end() for match in _CLAUSE_END.finditer(text)]
    return ends[-1] if ends else 0
