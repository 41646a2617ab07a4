"""What the LLM engine takes and gives: the chat payload, the options, the
engine handle and its error, apart from the builder in ``__init__``.

Its own module so that the backends and helpers (which need these types)
import it, not the package whose builder imports them: that was an import
circle, worked around with imports inside functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from duplex_server.engine.core import EngineCore
from duplex_server.engine.llm.tool_call_parser import Piece

LLM_BACKENDS = ("auto", "transformers", "vllm")
LLM_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ChatPayload:
    """One answer to generate: the chat (message dicts in the chat-template
    shape, system first if any) through the model's chat template, sampled at
    ``temperature`` (0: greedy), at most ``max_new_tokens`` tokens. ``tools``
    (JSON-schema function dicts) go to the template as its ``tools``;
    ``answer_prefix`` is text the answer is made to begin with (the prompt
    ends with it; the deltas continue after it); a remote gets the session's
    ``tool_choice`` in the Chat Completions shape instead."""

    messages: list[dict[str, Any]]
    temperature: float
    max_new_tokens: int
    tools: list[dict[str, Any]] = field(default_factory=list)
    answer_prefix: str = ""
    tool_choice: str | dict[str, Any] = "auto"


class LoadState(Protocol):
    """What a responder asks of the backend besides its engine."""

    @property
    def loaded(self) -> bool:
        """Its weights are up (they load on its own thread)."""
        ...

    @property
    def load_error(self) -> str | None: ...


class PromptMeasure(Protocol):
    """How a backend counts a chat against its context window (called off
    the event loop: it renders and tokenizes)."""

    @property
    def context_tokens(self) -> int:
        """The window: ``--llm-max-model-len``, or the checkpoint's own."""
        ...

    def prompt_tokens(self, payload: ChatPayload) -> int: ...


class RemoteProbe(Protocol):
    async def unreachable(self) -> str | None:
        """Why the remote cannot answer now (None: it can)."""
        ...


class Closable(Protocol):
    def close(self) -> None:
        """Stop the backend's threads or processes (blocking)."""
        ...


@dataclass(frozen=True)
class LLMEngine:
    # Text as it decodes; a remote's structured tool calls already parsed.
    core: EngineCore[ChatPayload, Piece]
    state: LoadState
    max_new_tokens: int  # the cap of any one answer
    # None: the backend fits prompts to its window on its own.
    measure: PromptMeasure | None = None
    backend: Closable | None = None  # stopped at server shutdown
    # A remote (``--llm-url``) takes tools and tool_choice as Chat Completions
    # does; a local backend prefixes the answer to force a call.
    remote: RemoteProbe | None = None

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


@dataclass(frozen=True)
class LLMOptions:
    """``--llm PATH`` and its companions (``--llm-*``), as the model registry
    gets them. ``kv_cache_bytes`` and ``gpu_memory_utilization`` are vLLM's;
    ``chat_template`` is the path of a Jinja file that replaces (or stands in
    for) the tokenizer's own template."""

    path: str
    backend: str = "auto"
    dtype: str = "auto"
    max_new_tokens: int = 256
    max_model_len: int | None = None
    max_num_seqs: int = 64
    kv_cache_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    chat_template: str | None = None
    device: str = "cpu"  # the transformers backend's (``--device``)
    enforce_eager: bool = False  # vLLM: no torch.compile of the model (faster start)
    threads: int = 1  # transformers on a CPU: its decode thread's torch threads
    tensor_parallel_size: int = 1  # vLLM: GPUs a model is split across
    pipeline_parallel_size: int = 1  # vLLM: pipeline stages
    engine_args: tuple[str, ...] = ()  # vLLM: more engine arguments, KEY=VALUE


@dataclass(frozen=True)
class RemoteOptions:
    """``--llm-url`` and its companions: the cascade's LLM on another server."""

    url: str  # the /v1 base
    model: str
    api_key: str | None = None
    timeout_s: float = 30.0  # connect, and the longest wait for the next piece
    retries: int = 2  # more tries before an answer began
    max_requests: int = 64  # in flight to the remote at once
    max_new_tokens: int = 256  # the cap of any one answer
    request_args: tuple[tuple[str, Any], ...] = ()  # more body fields, by the remote's names


class LLMConfigError(ValueError):
    """The ``--llm`` options name something this server cannot load."""
