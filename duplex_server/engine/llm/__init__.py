"""The AR text engine: chat requests from every session decoded together.

``build_llm_engine`` picks the backend named by ``--llm-backend``; the
transformers backend (``transformers_backend``) is imported only here, when
asked for, so the server starts without torch. vLLM is not installed on this
machine: asking for it is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from duplex_server.engine.core import EngineCore

LLM_BACKENDS = ("auto", "transformers", "vllm")
LLM_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ChatPayload:
    """One answer to generate: the chat (message dicts in the chat-template
    shape, system first if any) through the model's chat template, sampled at
    ``temperature`` (0: greedy), at most ``max_new_tokens`` tokens. ``tools``
    (JSON-schema function dicts) go to the template as its ``tools``;
    ``answer_prefix`` is text the answer is made to begin with (the prompt
    ends with it; the deltas continue after it)."""

    messages: list[dict[str, Any]]
    temperature: float
    max_new_tokens: int
    tools: list[dict[str, Any]] = field(default_factory=list)
    answer_prefix: str = ""


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


class Closable(Protocol):
    def close(self) -> None:
        """Stop the backend's threads or processes (blocking)."""
        ...


@dataclass(frozen=True)
class LLMEngine:
    core: EngineCore[ChatPayload, str]
    state: LoadState
    max_new_tokens: int  # the cap of any one answer
    # None: the backend fits prompts to its window on its own.
    measure: PromptMeasure | None = None
    backend: Closable | None = None  # stopped at server shutdown

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


class LLMConfigError(ValueError):
    """The ``--llm`` options name something this server cannot load."""


def check_checkpoint(path: str) -> Path:
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise LLMConfigError(
            f"--llm {path}: not a checkpoint directory (no config.json in it); "
            "give a local directory saved with save_pretrained"
        )
    return directory


def build_llm_engine(options: LLMOptions, max_concurrency: int = 64) -> LLMEngine:
    """The engine for ``--llm PATH``; the weights load on the backend's own
    thread (``loaded`` says when they are up), so this returns at once."""
    backend, dtype = options.backend, options.dtype
    if backend not in LLM_BACKENDS:
        raise LLMConfigError(f"--llm-backend {backend!r}: choose one of {', '.join(LLM_BACKENDS)}")
    if backend == "vllm":
        raise LLMConfigError(
            "--llm-backend vllm: vLLM is not installed in this server's environment; "
            "use --llm-backend transformers (or auto)"
        )
    if dtype not in LLM_DTYPES:
        raise LLMConfigError(f"--llm-dtype {dtype!r}: choose one of {', '.join(LLM_DTYPES)}")
    directory = check_checkpoint(options.path)
    # Imported here: the template module needs ChatPayload from this one, and
    # torch and transformers load only when an LLM is asked for.
    from duplex_server.engine.llm.chat_template import check_chat_template, read_chat_template
    from duplex_server.engine.llm.transformers_backend import TransformersBackend

    template = read_chat_template(options.chat_template)
    check_chat_template(directory, template)

    engine_backend = TransformersBackend(
        directory,
        dtype=dtype,
        chat_template=template,
        max_model_len=options.max_model_len,
        device=options.device,
    )
    core = EngineCore(engine_backend, max_concurrency=max_concurrency, name="llm")
    return LLMEngine(core, engine_backend, options.max_new_tokens, engine_backend, engine_backend)
