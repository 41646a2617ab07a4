"""A watchdog process that ends the engine processes a server leaves behind.

vLLM runs its engine core (and that core's worker) in processes of their
own. A clean exit stops them (the backend's ``close``), but a server killed
with SIGKILL runs no code: its engine processes would go on holding the
model's memory, orphaned. So the backend starts this reaper first, in a
session of its own (a signal to the server's process group does not reach
it), and tells it through a pipe which processes to end. The reaper reads
until the pipe closes, which happens when the server closes it or dies, by
any means; then it sends SIGTERM to those still alive (vLLM's engine core
stops its worker and frees its shared memory on SIGTERM), SIGKILL after
``GRACE_S`` to any left, and removes the engine's private runtime directory.

A process is named by its pid and its start time, so a pid reused by an
unrelated process after the engine's ended is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import IO

import psutil

GRACE_S = 5.0  # SIGTERM to SIGKILL
POLL_S = 0.1


class ProcessReaper:
    """The server's side: start the reaper, ``watch`` processes, ``close``."""

    def __init__(self, runtime_dir: str | None = None) -> None:
        argv = [sys.executable, "-m", "duplex_server.engine.llm.process_reaper"]
        if runtime_dir is not None:
            argv.append(runtime_dir)
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, start_new_session=True, close_fds=True
        )
        self.pid = self._proc.pid

    def descendants(self) -> set[int]:
        """This process's live descendants, less the reaper."""
        children = psutil.Process().children(recursive=True)
        return {child.pid for child in children} - {self.pid}

    def watch(self, pids: set[int]) -> None:
        stdin = self._stdin()
        for pid in sorted(pids):
            with contextlib.suppress(psutil.NoSuchProcess):
                stdin.write(f"{pid} {psutil.Process(pid).create_time()!r}\n".encode())
        stdin.flush()

    def close(self) -> None:
        """Let it reap what is left (nothing, after a clean stop) and exit."""
        stdin = self._proc.stdin
        if stdin is not None and not stdin.closed:
            stdin.close()
        self._proc.wait()

    def _stdin(self) -> IO[bytes]:
        assert self._proc.stdin is not None, "started with a pipe"
        return self._proc.stdin


# --- the reaper process -------------------------------------------------------


def _watched(lines: IO[bytes]) -> list[psutil.Process]:
    """The processes named on the pipe, read until it closes."""
    processes = []
    for line in lines:
        pid, started = line.split()
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(int(pid))
            if process.create_time() == float(started):
                processes.append(process)
    return processes


def _end(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    alive = processes
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)
        alive = [process for process in alive if _running(process)]
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main(argv: list[str]) -> None:
    # Ctrl-C in the server's terminal is for the server: the reaper waits for
    # the pipe to close (start_new_session keeps it out of that group too).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    processes = _watched(sys.stdin.buffer)
    _end(processes)
    if argv:
        shutil.rmtree(argv[0], ignore_errors=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
