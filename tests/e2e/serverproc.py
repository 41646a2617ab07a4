"""A real duplex-server in a subprocess, for tests that kill it with SIGKILL."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.conftest import free_port


class ServerProcess:
    def __init__(
        self, store: str, *extra: str, port: int | None = None, max_file_bytes: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.max_file_bytes = max_file_bytes
        self.store = store
        self.extra = extra
        self.proc: subprocess.Popen | None = None

    @property
    def ws_url(self) -> str:
        # events=both: the raw test clients see the journal as it is, both spellings
        return f"ws://127.0.0.1:{self.port}/v1/realtime?duplex=1&events=both"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ServerProcess:
        cmd = [
            sys.executable,
            "-m",
            "duplex_server.cli",
            "serve",
            "--port",
            str(self.port),
            "--store",
            self.store,
            "--log-level",
            "warning",
            *(() if "--model" in self.extra else ("--model", "echo")),
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
            preexec_fn=self._limits if self.max_file_bytes else None,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()}")
            try:
                with urllib.request.urlopen(self.http_url + "/health", timeout=1):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _limits(self) -> None:
        """In the child: files stop growing at max_file_bytes, like a full disk
        (EFBIG instead of SIGXFSZ)."""
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.max_file_bytes, self.max_file_bytes))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill9()


def run_cli(module: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` as a user would, capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=Path(__file__).resolve().parents[2],
    )
