"""The direct side of ``bench llm``: the same model answering the same
prompts without the server, as a caller of the engine library would.

- ``transformers``: a ``TransformersBackend`` behind an ``EngineCore``, as
  the server builds it (there is no other engine to call).
- ``vllm``: vLLM's ``AsyncLLM`` called directly (``generate`` with the
  prompt's token ids and delta output), not through the server's
  ``VllmBackend``: the baseline the issue names. Its environment is the
  one the server gives vLLM (no usage report, no hub, private IPC and
  cache directories), and its engine arguments are the server's for the
  same ``--llm-*`` options, so both sides run the same engine.

Each gives ``stream(prompt, tag, max_new)``: the answer's text deltas.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from duplex_bench import tiny_llm
from duplex_server.surface import ChatPayload, LLMOptions

READY_TIMEOUT_S = 600.0


class DirectTransformers:
    def __init__(self, options: LLMOptions) -> None:
        from duplex_server.surface import EngineCore, TransformersBackend

        self.backend = TransformersBackend(
            Path(options.path),
            dtype=options.dtype,
            max_num_seqs=options.max_num_seqs,
            threads=options.threads,
        )
        if not self.backend.wait_loaded(timeout=READY_TIMEOUT_S):
            raise SystemExit(f"bench llm: {self.backend.load_error}")
        self.core: EngineCore[Any, str] = EngineCore(
            self.backend, max_concurrency=512, name="bench"
        )

    @property
    def steps(self) -> int | None:
        """Decode forwards so far (None where the engine does not say)."""
        return self.backend.steps

    def stream(self, prompt: str, tag: str, max_new: int) -> AsyncIterator[str]:
        from duplex_server.surface import EngineRequest

        payload = ChatPayload(tiny_llm.chat(prompt), 0.0, max_new)
        return self.core.submit(EngineRequest(tag, tag, tag, 0, payload))

    def close(self) -> None:
        self.backend.close()


class DirectVllm:
    """``AsyncLLM`` built on the calling thread's event loop (set, not yet
    running: the caller runs its measurements on it)."""

    def __init__(self, options: LLMOptions) -> None:
        from duplex_server.surface import engine_arguments, private_environment, render_prompt

        self._runtime = Path(tempfile.mkdtemp(prefix="duplex-bench-vllm-"))
        environment = private_environment(self._runtime)
        for name in ("VLLM_RPC_BASE_PATH", "VLLM_CACHE_ROOT"):
            Path(environment[name]).mkdir(parents=True, exist_ok=True)
        os.environ.update(environment)
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._tokenizer = AutoTokenizer.from_pretrained(options.path, local_files_only=True)
        self._render = render_prompt
        self.engine: Any = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_arguments(options)))

    steps = None  # vLLM's scheduler steps are not counted here

    def prompt_ids(self, prompt: str, max_new: int) -> list[int]:
        payload = ChatPayload(tiny_llm.chat(prompt), 0.0, max_new)
        text = self._render(self._tokenizer, payload, None)
        return list(self._tokenizer(text, add_special_tokens=False).input_ids)

    async def stream(self, prompt: str, tag: str, max_new: int) -> AsyncIterator[str]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            temperature=0.0,
            max_tokens=max_new,
            output_kind=RequestOutputKind.DELTA,
            skip_special_tokens=True,
        )
        ids = TokensPrompt(prompt_token_ids=self.prompt_ids(prompt, max_new))
        async for output in self.engine.generate(ids, params, tag):
            delta = output.outputs[0].text
            if delta:
                yield delta

    def close(self) -> None:
        self.engine.shutdown()
        shutil.rmtree(self._runtime, ignore_errors=True)


def open_direct(options: LLMOptions) -> DirectTransformers | DirectVllm:
    if options.backend == "vllm":
        return DirectVllm(options)
    return DirectTransformers(options)
