"""``--llm-engine-arg KEY=VALUE``: more of vLLM's engine arguments, read by vLLM's own parser.

vLLM has some two hundred engine arguments (batching, caching, parallelism,
quantization, speculative decoding); the server names the few it has flags
for and passes the rest through. Each is checked by the parser vLLM's own
``vllm serve`` uses (``AsyncEngineArgs.add_cli_args``), so a name vLLM does
not know, or a value of the wrong type, is refused at start and by name,
and the value reaches vLLM as the type vLLM converts it to. The arguments
the server sets itself from its own flags are refused here, with the flag
to use, so that one setting has one spelling.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from duplex_server.engine.llm.interface import LLMConfigError

# Engine arguments the server sets from its own flags.
OWN_FLAGS = {
    "model": "--llm",
    "dtype": "--llm-dtype",
    "max_model_len": "--llm-max-model-len",
    "max_num_seqs": "--llm-max-num-seqs",
    "kv_cache_memory_bytes": "--llm-kv-cache-bytes",
    "gpu_memory_utilization": "--llm-gpu-memory-utilization",
    "enforce_eager": "--llm-enforce-eager",
    "tensor_parallel_size": "--llm-tensor-parallel-size",
    "pipeline_parallel_size": "--llm-pipeline-parallel-size",
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def passed_engine_args(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as ``AsyncEngineArgs`` keywords (imports vLLM).
    Parsed once: the start-up check and the engine's load ask alike."""
    return dict(_parsed(pairs)) if pairs else {}


@functools.cache
def _parsed(pairs: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(
        FlexibleArgumentParser(exit_on_error=False, add_help=False)
    )
    names = [_name(pair) for pair in pairs]
    argv = [word for pair, name in zip(pairs, names, strict=True) for word in _argv(pair, name)]
    try:
        parsed, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise LLMConfigError(f"--llm-engine-arg: {exc}") from None
    if unknown:
        raise LLMConfigError(
            f"--llm-engine-arg: vLLM has no engine argument {unknown[0].lstrip('-')!r}"
        )
    return tuple((name, getattr(parsed, name)) for name in names)


def _name(pair: str) -> str:
    key, equals, _ = pair.partition("=")
    name = key.strip().replace("-", "_")
    if not equals or not name:
        raise LLMConfigError(f"--llm-engine-arg {pair!r}: give KEY=VALUE")
    if name in OWN_FLAGS:
        raise LLMConfigError(f"--llm-engine-arg {name}: set it with {OWN_FLAGS[name]}")
    return name


def _argv(pair: str, name: str) -> list[str]:
    """The pair as vLLM's command line spells it: a switch is
    ``--flag`` / ``--no-flag``, anything else ``--flag VALUE``."""
    value = pair.partition("=")[2].strip()
    flag = "--" + name.replace("_", "-")
    if value.lower() in _TRUE | _FALSE:
        return [flag if value.lower() in _TRUE else "--no-" + flag[2:]]
    return [flag, value]
