"""The cascade's LLM on another server: an OpenAI-compatible ``/v1`` base
(``vllm serve``, SGLang, llama.cpp's server, Ollama, OpenAI) answering
``chat.completions`` with ``stream=true``.

The backend takes the same :class:`ChatPayload` as the in-process ones and
yields the answer's text as it streams, and each tool call the remote
returned (its structured ``tool_calls``) as a :class:`ParsedToolCall`, so
the responder treats both alike. Only the chat's wire shape differs: a
call's arguments go as JSON text, ``tool_choice`` is the remote's to honour
(no forced answer prefix).

Closing the stream (a fence: barge-in, cancel) closes the HTTP response,
and with it the connection: the remote sees the client go and aborts the
request, so nothing is left generating. A request is retried only before
any of its answer arrived (the connection refused or reset, a 429 or 5xx),
never after: a half-answer is not asked for again. A chat longer than the
remote's window (its 400 says so) loses its oldest turns and is asked again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec

from duplex_server import metrics
from duplex_server.engine.core import EngineRequest
from duplex_server.engine.llm.context_window import drop_oldest_turns
from duplex_server.engine.llm.interface import ChatPayload, RemoteOptions
from duplex_server.engine.llm.tool_call_parser import Piece, checked_call
from duplex_server.engine.probe import SharedProbe

log = logging.getLogger(__name__)

# What one request body may not have set by --llm-request-arg: the server's own.
OWN_FIELDS = frozenset(
    {"model", "messages", "stream", "tools", "tool_choice", "temperature", "max_tokens"}
)
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_ERROR_BYTES = 4096  # of a refusal's body, quoted in the error


class RemoteLLMError(Exception):
    """The remote refused the request, failed mid-answer or does not answer."""


class _ToolCallDelta(msgspec.Struct):
    """A piece of a call (the remote's call id is not kept: the response names its calls)."""

    index: int = 0
    function: dict[str, Any] = msgspec.field(default_factory=dict)


class _Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(msgspec.Struct):
    delta: _Delta = msgspec.field(default_factory=_Delta)


class _Chunk(msgspec.Struct):
    """One ``chat.completion.chunk`` (or the error some servers stream)."""

    choices: list[_Choice] = msgspec.field(default_factory=list)
    error: Any = None
    object: str | None = None
    message: str | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


def parse_request_args(pairs: list[str]) -> tuple[tuple[str, Any], ...]:
    """``KEY=JSON`` pairs (``top_k=20``, ``chat_template_kwargs={"enable_thinking":false}``);
    a value that is not JSON is taken as text. The server's own fields are refused."""
    parsed = []
    for pair in _rejoined(pairs):
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--llm-request-arg {pair!r}: give KEY=VALUE")
        if key in OWN_FIELDS:
            raise ValueError(f"--llm-request-arg {key}: the server sets it (from the session)")
        try:
            value: Any = json.loads(text)
        except json.JSONDecodeError:
            value = text
        parsed.append((key, value))
    return tuple(parsed)


def _rejoined(pieces: list[str]) -> list[str]:
    """The setting's list is split at commas; a JSON value's own commas
    (``{"a":1,"b":2}``) split it too: a piece that does not start with a
    ``KEY=`` belongs to the one before."""
    pairs: list[str] = []
    for piece in pieces:
        key = piece.partition("=")[0].strip()
        if pairs and ("=" not in piece or not key.isidentifier()):
            pairs[-1] += "," + piece
        else:
            pairs.append(piece)
    return pairs


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat in the Chat Completions shape: a call's arguments as JSON text."""
    wired = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "tool_calls": [_wire_call(call) for call in calls]}
        wired.append(message)
    return wired


def _wire_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    arguments = function["arguments"]
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {**call, "function": {**function, "arguments": arguments}}


CLOSE_TIMEOUT_S = 5.0


class RemoteChatBackend:
    """An ``EngineBackend[ChatPayload, Piece]`` and the
    engine's load state (nothing loads: it is up at once)."""

    loaded = True
    load_error = None

    def __init__(self, options: RemoteOptions) -> None:
        self.options = options
        self.base = options.url.rstrip("/")
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the client's
        self._probe = SharedProbe(self._probe_models)
        self._requests = metrics.LLM_REMOTE_REQUESTS

    def _http(self) -> httpx.AsyncClient:
        """One client, made on the loop that uses it: its connections are reused."""
        if self._client is None:
            headers = {}
            if self.options.api_key:
                headers["authorization"] = f"Bearer {self.options.api_key}"
            limit = self.options.max_requests
            self._loop = asyncio.get_running_loop()
            self._client = httpx.AsyncClient(
                headers=headers,
                timeout=httpx.Timeout(self.options.timeout_s),
                limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
            )
        return self._client

    def body(self, payload: ChatPayload) -> dict[str, Any]:
        body: dict[str, Any] = dict(self.options.request_args)
        body.update(
            model=self.options.model,
            messages=wire_messages(payload.messages),
            stream=True,
            temperature=payload.temperature,
            max_tokens=payload.max_new_tokens,
        )
        if payload.tools:
            body["tools"] = payload.tools
            body["tool_choice"] = payload.tool_choice
        return body

    async def generate(self, request: EngineRequest[ChatPayload]) -> AsyncIterator[Piece]:
        outcome, response = "failed", None  # failed: refused, unreachable or broken off
        try:
            response = await self._open(request.payload)
            async for piece in self._pieces(response):
                yield piece
            outcome = "completed"
        except (GeneratorExit, asyncio.CancelledError):
            outcome = "aborted"  # the fence closed the stream: the connection goes with it
            raise
        finally:
            self._requests.labels(outcome).inc()
            if response is not None:
                await response.aclose()

    async def _open(self, payload: ChatPayload) -> httpx.Response:
        """The streaming response, once the remote accepted the request."""
        url = f"{self.base}/chat/completions"
        tries = 0
        while True:
            tries += 1
            try:
                request = self._http().build_request("POST", url, json=self.body(payload))
                response = await self._http().send(request, stream=True)
            except httpx.TransportError as exc:
                if tries > self.options.retries:
                    raise RemoteLLMError(
                        f"the LLM at {self.base} does not answer ({exc!r})"
                    ) from exc
                await self._back_off(tries, None)
                continue
            if response.status_code == 200:
                return response
            detail = await _refusal_text(response)
            if response.status_code in RETRIED_STATUSES and tries <= self.options.retries:
                await self._back_off(tries, response.headers.get("retry-after"))
                continue
            if response.status_code == 400 and _too_long(detail):
                shorter = drop_oldest_turns(payload, 2 ** (tries - 1))
                if shorter is not None:
                    log.warning("the chat is longer than the remote's window: oldest turns dropped")
                    payload = shorter
                    continue
            raise RemoteLLMError(
                f"the LLM at {self.base} refused the request ({response.status_code}: {detail})"
            )

    async def _back_off(self, tries: int, retry_after: str | None) -> None:
        self._requests.labels("retried").inc()
        delay = 0.2 * 2 ** (tries - 1)
        if retry_after is not None and retry_after.isdigit():
            delay = min(float(retry_after), self.options.timeout_s)
        await asyncio.sleep(delay)

    async def _pieces(self, response: httpx.Response) -> AsyncIterator[Piece]:
        """Text as it streams; the calls once the answer ended (a call is
        whole only then)."""
        calls: dict[int, dict[str, str]] = {}
        try:
            async for line in response.aiter_lines():
                data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
                if not data:
                    continue
                if data == "[DONE]":
                    break
                chunk = _decode(data)
                for choice in chunk.choices[:1]:
                    if choice.delta.content:
                        yield choice.delta.content
                    for call in choice.delta.tool_calls or []:
                        _gather(calls.setdefault(call.index, {"name": "", "arguments": ""}), call)
        except httpx.TransportError as exc:  # mid-answer: never asked for again
            raise RemoteLLMError(f"the LLM at {self.base} failed mid-answer ({exc!r})") from exc
        for index in sorted(calls):
            gathered = calls[index]
            raw = json.dumps(gathered, ensure_ascii=False)
            yield checked_call(gathered["name"], gathered["arguments"] or "{}", raw)

    async def unreachable(self) -> str | None:
        """Why the remote cannot answer now (None: it can): ``GET /models``
        lists the model. One probe at a time, its answer reused a second."""
        return await self._probe()

    async def _probe_models(self) -> str | None:
        try:
            answer = await self._http().get(f"{self.base}/models", timeout=2.0)
        except httpx.TransportError as exc:
            return f"the LLM at {self.base} does not answer ({type(exc).__name__})"
        if answer.status_code != 200:
            return f"the LLM at {self.base} answers {answer.status_code} to GET /models"
        try:
            served = [entry.get("id") for entry in answer.json().get("data", [])]
        except (ValueError, AttributeError):
            return f"the LLM at {self.base} lists no models"
        if self.options.model not in served:
            return f"the LLM at {self.base} does not serve {self.options.model!r}"
        return None

    def close(self) -> None:
        """Close the pooled connections at shutdown (a remote behind a proxy
        otherwise holds them until its idle timeout). Called off the loop
        (``close_model``): the close runs on the client's own loop, waited
        for a bounded time; on that loop itself it is only scheduled."""
        client, loop, self._client = self._client, self._loop, None
        if client is None or loop is None or not loop.is_running():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:  # no loop in this thread: the usual case
            on_loop = False
        if on_loop:
            loop.create_task(client.aclose())
            return
        try:
            asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.warning("the LLM client at %s did not close in %s s", self.base, CLOSE_TIMEOUT_S)


def _decode(data: str) -> _Chunk:
    try:
        chunk = _decode_chunk(data)
    except msgspec.DecodeError as exc:
        raise RemoteLLMError(
            f"the LLM streamed something that is not a chunk: {data[:200]!r}"
        ) from exc
    if chunk.error is not None or chunk.object == "error":
        raise RemoteLLMError(f"the LLM failed mid-answer: {chunk.error or chunk.message}")
    return chunk


def _gather(call: dict[str, str], delta: _ToolCallDelta) -> None:
    """A call streams in pieces: its name first, its arguments' text after."""
    call["name"] += delta.function.get("name") or ""
    call["arguments"] += delta.function.get("arguments") or ""


def _too_long(detail: str) -> bool:
    text = detail.lower()
    return "context length" in text or "maximum context" in text or "too long" in text


async def _refusal_text(response: httpx.Response) -> str:
    body = b""
    async for part in response.aiter_bytes():
        body += part
        if len(body) >= MAX_ERROR_BYTES:
            break
    await response.aclose()
    return body[:MAX_ERROR_BYTES].decode("utf-8", "replace").strip()
