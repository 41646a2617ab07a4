"""The vLLM AR backend: vLLM's in-process async engine (``AsyncLLM``)
decodes the requests of every session, batched continuously by its scheduler.

``AsyncLLM`` lives on an event loop of its own, on the backend's thread: its
constructor blocks for tens of seconds (it spawns the engine core and its
worker, loads the weights, may compile the model), and its output handler
(detokenising, per-request queues) then runs there, off the server's loop.
``generate`` bridges the two loops: the request runs as a task on the
engine's loop, which posts each text delta to the caller's queue with
``call_soon_threadsafe``. When the caller stops reading (the answer ended,
EngineCore aborted it, its task was cancelled by a barge-in) that task is
cancelled and awaited; vLLM aborts a request whose generator is cancelled,
so by the time ``generate`` has closed, the engine core has been told to
stop decoding it, and nothing decoded after that reaches the caller.

The prompt is the same text and token ids the transformers backend would
use (``chat_template.render_prompt``, no special tokens added), so both
answer alike. vLLM's processes never outlive the server: ``close`` (at
exit, after SIGTERM or SIGINT) shuts the engine down, and a ``ProcessReaper``
ends them if the server is killed without running any code.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duplex_server.engine.core import EngineRequest
from duplex_server.engine.llm.chat_template import check_has_template, render_prompt
from duplex_server.engine.llm.interface import ChatPayload, LLMOptions
from duplex_server.engine.llm.process_reaper import ProcessReaper
from duplex_server.engine.llm.vllm_args import passed_engine_args

logger = logging.getLogger(__name__)


class GenerationFailed(Exception):
    """vLLM failed this request, or is not there to take it."""


@dataclass
class _End:
    error: str | None = None


def private_environment(runtime: Path) -> dict[str, str]:
    """What vLLM reads from the environment, set before it is imported: no
    usage report, no hub access (checkpoints are local or already cached),
    its IPC sockets and compile cache in this server's own directory."""
    return {
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_RPC_BASE_PATH": str(runtime / "rpc"),
        "VLLM_CACHE_ROOT": str(runtime / "cache"),
    }


def engine_arguments(options: LLMOptions) -> dict[str, Any]:
    """``AsyncEngineArgs`` of the ``--llm-*`` options (``--llm-engine-arg``'s
    checked by vLLM's own parser)."""
    return {
        "model": options.path,
        "dtype": options.dtype,
        "max_model_len": options.max_model_len,
        "max_num_seqs": options.max_num_seqs,
        "kv_cache_memory_bytes": options.kv_cache_bytes,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "enforce_eager": options.enforce_eager,
        "tensor_parallel_size": options.tensor_parallel_size,
        "pipeline_parallel_size": options.pipeline_parallel_size,
        # Its stat loggers on: the Prometheus one records the ``vllm:*`` series
        # (TTFT, TPOT, queue, KV cache) that /metrics serves beside ours.
        "disable_log_stats": False,
        "seed": 0,
        **passed_engine_args(options.engine_args),
    }


class VllmBackend:
    """Engine backend: ``generate(request)`` yields text deltas of a
    :class:`ChatPayload`'s answer, decoded by vLLM."""

    def __init__(self, options: LLMOptions, chat_template: str | None = None) -> None:
        self.path = Path(options.path)
        self._options = options
        self._chat_template = chat_template
        self._runtime = Path(tempfile.mkdtemp(prefix="duplex-vllm-"))
        self._reaper = ProcessReaper(str(self._runtime))
        self._loop = asyncio.new_event_loop()
        self._loaded = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self.load_error: str | None = None
        self.engine_error: str | None = None  # it died after loading
        self.engine_pids: set[int] = set()
        self._engine: Any = None  # vllm's AsyncLLM, once built
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()  # the engine's loop and prompt_tokens share it
        self._window = options.max_model_len or 0  # set from the checkpoint when it loads
        self._tasks: dict[int, asyncio.Task[None]] = {}  # on the engine's loop only
        self._keys = itertools.count()
        self._thread = threading.Thread(target=self._run, name="llm-vllm", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    @property
    def loaded(self) -> bool:
        """Up and answering: not while it loads, nor after it failed to, nor
        once its engine core died (vLLM's client notices that by itself)."""
        engine = self._engine
        if not self._loaded.is_set() or engine is None or self.engine_error is not None:
            return False
        return not engine.errored

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._loaded.wait(timeout) and self.loaded

    @property
    def context_tokens(self) -> int:
        """The window: ``--llm-max-model-len``, or the checkpoint's own."""
        return self._window

    def prompt_tokens(self, payload: ChatPayload) -> int:
        """The prompt's length in tokens (blocking: call it off the event loop)."""
        return len(self._prompt_ids(payload))

    def _prompt_ids(self, payload: ChatPayload) -> list[int]:
        with self._tokenizer_lock:
            text = render_prompt(self._tokenizer, payload, self._chat_template)
            return list(self._tokenizer(text, add_special_tokens=False).input_ids)

    def unfinished_requests(self) -> int:
        """Requests vLLM still holds (its output processor's count)."""
        return 0 if self._engine is None else int(self._engine.get_num_unfinished_requests())

    async def generate(self, request: EngineRequest[ChatPayload]) -> AsyncIterator[str]:
        self._check_ready()
        caller = asyncio.get_running_loop()
        out: asyncio.Queue[str | _End] = asyncio.Queue()

        def post(item: str | _End) -> None:
            # A closed caller loop (RuntimeError) has nobody listening.
            with contextlib.suppress(RuntimeError):
                caller.call_soon_threadsafe(out.put_nowait, item)

        key = next(self._keys)
        task = asyncio.run_coroutine_threadsafe(self._decode(key, request, post), self._loop)
        task.add_done_callback(lambda done: post(_End(self._failure(done))))
        ended = False
        try:
            while True:
                item = await out.get()
                if isinstance(item, _End):
                    ended = True
                    if item.error is not None:
                        raise GenerationFailed(item.error)
                    return
                yield item
        finally:
            if not ended:  # closed early (abort) or cancelled (barge-in)
                await self._stop_soon(key)

    def close(self) -> None:
        """Stop the engine and its processes (waits for a load in progress)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        with contextlib.suppress(RuntimeError):  # the loop already closed
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._reaper.close()
        shutil.rmtree(self._runtime, ignore_errors=True)

    async def _stop_soon(self, key: int) -> None:
        try:
            stop = asyncio.run_coroutine_threadsafe(self._stop(key), self._loop)
        except RuntimeError:
            return  # the engine's loop is closed: nothing decodes any more
        await asyncio.wrap_future(stop)

    def _check_ready(self) -> None:
        if self._closed:
            raise GenerationFailed("the LLM engine is shut down")
        if not self._loaded.is_set():
            raise GenerationFailed("the LLM engine is still loading")
        if self.load_error is not None or self.engine_error is not None:
            raise GenerationFailed(self.load_error or self.engine_error or "")

    def _failure(self, done: Future[None]) -> str | None:
        if done.cancelled():
            return "the LLM engine is shut down" if self._closed else "the request was stopped"
        error = done.exception()
        if error is None:
            return None
        message = f"generation failed: {type(error).__name__}: {error}"
        if type(error).__name__ == "EngineDeadError":
            self.engine_error = f"the vLLM engine died: {error}"
            logger.error("llm: %s", self.engine_error)
        return message

    # --- the engine's thread and loop ----------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._load()
        except (OSError, ValueError, RuntimeError, ImportError) as exc:
            self.load_error = f"cannot load {self.path} on vLLM: {exc}"
            logger.error("llm: %s", self.load_error)
        finally:
            if self._engine is None and self.load_error is None:
                self.load_error = f"cannot load {self.path} on vLLM (see the log)"
            self._loaded.set()
        if self._engine is not None:
            logger.info("llm: vLLM loaded %s", self.path)
        try:
            self._loop.run_forever()
        finally:
            self._shutdown()

    def _load(self) -> None:
        environment = private_environment(self._runtime)
        for name in ("VLLM_RPC_BASE_PATH", "VLLM_CACHE_ROOT"):
            Path(environment[name]).mkdir(parents=True, exist_ok=True)
        os.environ.update(environment)
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        check_has_template(tokenizer, self._chat_template)
        before = self._reaper.descendants()
        args = AsyncEngineArgs(**engine_arguments(self._options))
        self._tokenizer = tokenizer
        if not self._window:
            self._window = int(args.max_model_len or _checkpoint_window(self.path))
        try:
            # Held by the backend only (not a local: a frame that outlives this
            # call would keep the engine until the interpreter tears down).
            self._engine = AsyncLLM.from_engine_args(args)
        finally:
            # Whatever it started, the reaper ends if the server dies.
            self.engine_pids = self._reaper.descendants() - before
            self._reaper.watch(self.engine_pids)

    def _shutdown(self) -> None:
        """On the engine's thread, once its loop stopped: end what is in
        flight, then the engine core and its worker."""
        pending = [task for task in self._tasks.values() if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.wait(pending))
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        # Let its output handler finish cancelling, so nothing holds the
        # engine when the interpreter tears down.
        rest = asyncio.all_tasks(self._loop)
        if rest:
            self._loop.run_until_complete(asyncio.wait(rest))
        self._loop.close()

    async def _decode(
        self, key: int, request: EngineRequest[ChatPayload], post: Callable[[str], None]
    ) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        current = asyncio.current_task()
        assert current is not None
        self._tasks[key] = current
        try:
            payload = request.payload
            ids = self._prompt_ids(payload)
            params = SamplingParams(
                temperature=max(payload.temperature, 0.0),
                max_tokens=payload.max_new_tokens,
                output_kind=RequestOutputKind.DELTA,
                skip_special_tokens=True,
            )
            prompt = TokensPrompt(prompt_token_ids=ids)
            async for output in self._engine.generate(prompt, params, request.request_id):
                delta = output.outputs[0].text
                if delta:
                    post(delta)
        finally:
            del self._tasks[key]

    async def _stop(self, key: int) -> None:
        """Cancel the request's task and wait until vLLM has aborted it."""
        task = self._tasks.get(key)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])


def _checkpoint_window(path: Path) -> int:
    """The checkpoint's own context length (its config's), 4096 if it names none."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    return int(getattr(config, "max_position_embeddings", None) or 4096)
