"""The cascade's LLM responder: the conversation as a chat, answered by the
AR engine, its text handed on piece by piece as the tokens decode (the
cascade groups it into clauses for speech, and streams it as it comes for
text), its tool calls handed on as calls.

The answer streams through a :class:`ToolCallParser`: plain text goes on to
speech (or text deltas), ``<tool_call>`` markup never does; a complete call
becomes a :class:`FunctionCallPart` (a ``function_call`` item of the
response), a malformed one ends the answer with an error that quotes it
(the client gets ``engine_error``; the text before it stays). The token
figures (:mod:`llm_timing`) and how many old messages a long chat lost to
the context window go out as stage times, with the answer's output, into
the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator

from duplex_server.engine import EngineRequest
from duplex_server.engine.llm import ChatPayload, LLMEngine
from duplex_server.engine.llm.context_window import fit_chat
from duplex_server.engine.llm.tool_call_parser import (
    MalformedToolCall,
    ParsedToolCall,
    Piece,
    ToolCallParser,
)
from duplex_server.models.cascade.llm_chat import (
    chat_messages,
    has_question,
    remote_tool_setup,
    tool_setup,
)
from duplex_server.models.cascade.llm_timing import TokenClock
from duplex_server.models.cascade.payload import SpeakPayload
from duplex_server.models.cascade.responder import Reply, StageTimes
from duplex_server.sessions.core.model_port import FunctionCallPart, HistoryItem, SessionView

log = logging.getLogger(__name__)


class MalformedToolCallError(Exception):
    """The model wrote a tool call that is not valid: the answer ends there."""


class LLMResponder:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    @property
    def loaded(self) -> bool:
        return self.engine.state.loaded

    def close(self) -> None:
        self.engine.close()

    async def unreachable(self) -> str | None:
        remote = self.engine.remote
        return None if remote is None else await remote.unreachable()

    async def respond(
        self, history: list[HistoryItem], request: EngineRequest[SpeakPayload]
    ) -> AsyncIterator[Reply]:
        payload = request.payload
        messages = chat_messages(history, payload.config.instructions)
        if not has_question(messages):
            return  # nothing said to answer yet (a greeting on a new session)
        chat_payload, dropped = await self._fit(self._chat_payload(messages, payload.config))
        if dropped:
            log.warning(
                "%s: the chat is longer than the context window; its %d oldest "
                "messages were left out",
                request.response_id,
                dropped,
            )
            yield StageTimes({"llm_context_dropped_messages": float(dropped)})
        chat = EngineRequest(
            request_id=request.request_id,
            session_id=request.session_id,
            response_id=request.response_id,
            epoch=request.epoch,
            payload=chat_payload,
            priority=request.priority,
        )
        clock = TokenClock()
        stream = self.engine.core.submit(chat)
        try:
            async for reply in self._replies(stream, chat_payload.answer_prefix, clock, chat):
                yield reply
        finally:
            # An answer abandoned (cancel, barge-in) stops decoding now.
            self.engine.core.abort(chat.request_id)
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()

    def _chat_payload(self, messages: list[dict[str, object]], config: SessionView) -> ChatPayload:
        cap = self.engine.max_new_tokens
        if isinstance(config.max_output_tokens, int):
            cap = min(cap, config.max_output_tokens)
        tools = remote_tool_setup(config) if self.engine.remote else tool_setup(config)
        return ChatPayload(
            messages, config.temperature, cap, tools.tools, tools.answer_prefix, tools.tool_choice
        )

    async def _fit(self, payload: ChatPayload) -> tuple[ChatPayload, int]:
        measure = self.engine.measure
        if measure is None or not self.engine.state.loaded:
            return payload, 0  # nothing to count with: the backend cuts what is too long
        return await asyncio.to_thread(
            fit_chat, payload, measure.prompt_tokens, measure.context_tokens
        )

    async def _replies(
        self,
        stream: AsyncIterator[Piece],
        prefix: str,
        clock: TokenClock,
        chat: EngineRequest[ChatPayload],
    ) -> AsyncIterator[Reply]:
        parser = ToolCallParser()
        # Calls are handed on when the answer ends (after its figures and its
        # last words): a call is complete only then.
        calls: list[FunctionCallPart] = []
        pieces = parser.feed(prefix)
        async for delta in stream:
            ttft_ms = clock.tick()
            if ttft_ms is not None:
                yield StageTimes({"llm_ttft_ms": ttft_ms})
            # a remote's calls come parsed; text goes through the parser
            pieces += parser.feed(delta) if isinstance(delta, str) else [delta]
            for reply in _handle(pieces, chat.response_id, len(calls)):
                if isinstance(reply, FunctionCallPart):
                    calls.append(reply)
                else:
                    yield reply
            pieces = []
        for reply in _handle([*pieces, *parser.finish()], chat.response_id, len(calls)):
            if isinstance(reply, FunctionCallPart):
                calls.append(reply)
            else:
                yield reply
        yield StageTimes(clock.figures())
        for call in calls:
            yield call


def _handle(pieces: list[Piece], response_id: str, calls: int) -> list[Reply]:
    """Text as it is; a complete call as a :class:`FunctionCallPart`; a
    malformed one ends the answer (the text before it was handed on)."""
    replies: list[Reply] = []
    for piece in pieces:
        if isinstance(piece, str):
            replies.append(piece)
            continue
        if isinstance(piece, MalformedToolCall):
            raise MalformedToolCallError(
                f"the model wrote a tool call that is {piece.reason}: {piece.raw[:500]!r}"
            )
        assert isinstance(piece, ParsedToolCall)
        calls += 1
        call_id = f"call_{response_id.removeprefix('resp_')}_{calls}"
        call = FunctionCallPart(call_id=call_id, name=piece.name, arguments=piece.arguments)
        replies.append(call)
    return replies
