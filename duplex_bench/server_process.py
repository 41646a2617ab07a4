"""A real duplex-server in a child process, for the benches and the end-to-end tests.

Benches ship in the package and cannot import ``tests/``, so the one helper
lives here and ``tests/e2e/serverproc.py`` only sets the tests' defaults on
it. It has no opinion on how fast a server starts: the health wait is a
limit on a broken start, not a measurement.
"""

from __future__ import annotations

import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO, Self

HOST = "127.0.0.1"  # where `serve` listens by default
HEALTH_POLL_S = 0.05

FlagValue = str | int | float | Path | None


def free_port() -> int:
    """A port nothing listens on now (something else may still take it first)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class ServerStartError(RuntimeError):
    """The server exited, or never answered ``/health``; the message carries its stderr."""


class ServerProcess:
    """``python -m duplex_server.cli serve`` in a child process.

    ``store`` and ``port`` are always given; ``model`` and ``log_level`` have
    the defaults every caller wants (``None`` leaves a flag to the CLI's own
    default). Any other keyword is a ``serve`` flag: ``max_sessions=110``
    becomes ``--max-sessions 110``, and ``None`` leaves it out. ``extra`` is
    appended as given, after them, so it can override any of them.
    ``max_file_bytes`` caps the size of every file the server writes, as a
    full disk would; ``max_open_files`` caps its file descriptors.
    """

    def __init__(
        self,
        store: str = "memory",
        *extra: str,
        port: int | None = None,
        model: str | None = "echo",
        log_level: str | None = "warning",
        ws_path: str = "/v1/realtime?duplex=1",
        max_file_bytes: int | None = None,
        max_open_files: int | None = None,
        cwd: str | Path | None = None,
        **flags: FlagValue,
    ) -> None:
        self.store = store
        self.extra = extra
        self.port = port or free_port()
        # Every bench and test client connects from this one address: the
        # per-address caps would measure themselves, not the server.
        per_address: dict[str, FlagValue] = {
            "max_connections_per_ip": 0,
            "max_connection_rate_per_ip": 0,
            "max_sessions_per_ip": 0,
        }
        self.flags: dict[str, FlagValue] = {
            "model": model,
            "log_level": log_level,
            **per_address,
            **flags,
        }
        self.ws_path = ws_path
        self.max_file_bytes = max_file_bytes
        self.max_open_files = max_open_files
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        # stderr goes to a file: a pipe nobody reads fills at 64 KiB and then
        # blocks the server on its next log line.
        self._log: IO[bytes] | None = None

    @property
    def base(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.base}"

    @property
    def ws_url(self) -> str:
        return self.ws_at(self.ws_path)

    def ws_at(self, path: str) -> str:
        """The WebSocket URL of another endpoint (``/v1/duplex``, other query)."""
        return f"ws://{self.base}{path}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "duplex_server.cli", "serve"]
        argv += ["--port", str(self.port), "--store", self.store]
        for name, value in self.flags.items():
            if value is not None:
                argv += [f"--{name.replace('_', '-')}", str(value)]
        return [*argv, *self.extra]

    def start(self, timeout_s: float = 30.0) -> Self:
        """Spawn the server and return once ``/health`` answers."""
        command = self.command()
        self._forget_log()
        self._log = tempfile.TemporaryFile(prefix="duplex-server-log")  # noqa: SIM115  # lives as long as this object
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            cwd=self.cwd,
            preexec_fn=self._set_limits if self.max_file_bytes or self.max_open_files else None,
        )
        deadline = time.monotonic() + timeout_s
        while not self._healthy():
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"{shlex.join(command)} exited with status {self.proc.returncode}:\n"
                    f"{self._stderr()}"
                )
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise ServerStartError(
                    f"{shlex.join(command)} did not answer {self.http_url}/health "
                    f"within {timeout_s:g} s:\n{self._stderr()}"
                )
            time.sleep(HEALTH_POLL_S)
        return self

    def kill9(self) -> None:
        """SIGKILL, as a crash would: no shutdown, nothing flushed."""
        assert self.proc is not None, "not started"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL if it takes longer than ``timeout_s``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill9()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.http_url + "/health", timeout=1):
                return True
        except OSError:  # refused, not up yet, or answering an error status
            return False

    def log_text(self) -> str:
        """Everything the server wrote to stderr so far."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def _stderr(self) -> str:
        text = self.log_text()
        self._forget_log()
        return text.strip() or "(nothing on stderr)"

    def _forget_log(self) -> None:
        """Close the server's stderr file (after a failed start; else the
        log outlives the process, for whoever reads it after a stop)."""
        if self._log is not None:
            self._log.close()
            self._log = None

    def _set_limits(self) -> None:
        """In the child: files stop growing at max_file_bytes, like a full disk
        (EFBIG instead of SIGXFSZ); descriptors stop at max_open_files."""
        if self.max_file_bytes:
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.max_file_bytes, self.max_file_bytes))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if self.max_open_files:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_open_files, self.max_open_files))
