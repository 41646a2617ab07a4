"""A recogniser that holds the GIL, run in a process of its own.

PocketSphinx decodes without releasing the GIL: on a thread of the server it
stalls the event loop for the whole decode (measured: 1.8 s for a 4 s
utterance), and with it every session of the process. In a worker process
the ASR stage's thread only waits on a pipe, which releases the GIL.

One worker per recogniser configuration, shared by every cascade built in
the process (the tests build many servers in one interpreter). It starts
loading when the cascade is built (before the server listens), so the first
turn does not wait for a process to start, and it ends with the process
that started it: on a clean exit the executor stops it, and after a crash
(``kill -9``) its watchdog sees it was orphaned and exits, so no worker
outlives its server.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ProcessPoolExecutor
from typing import Protocol


class Decoder(Protocol):
    def transcribe(self, pcm16: bytes, language: str | None, prompt: str | None) -> str: ...


_decoder: Decoder | None = None  # in the worker: the one loaded recogniser


ORPHAN_POLL_S = 0.5


def _load(factory: Callable[[], Decoder], parent_pid: int) -> None:
    global _decoder
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    _decoder = factory()


def _exit_when_orphaned(parent_pid: int) -> None:
    """The server died without stopping this worker: end it (a decode in
    progress is for a session that is gone)."""
    while os.getppid() == parent_pid:
        time.sleep(ORPHAN_POLL_S)
    os._exit(0)


def _loaded() -> bool:
    return _decoder is not None


def _transcribe(pcm16: bytes, language: str | None, prompt: str | None) -> str:
    assert _decoder is not None, "the worker's initializer loads the decoder"
    return _decoder.transcribe(pcm16, language, prompt)


class WorkerProcess:
    """The recogniser ``factory`` builds, behind one worker process; called
    from the ASR stage's thread, one decode at a time."""

    def __init__(self, factory: Callable[[], Decoder]) -> None:
        self._factory = factory
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._executor().submit(_loaded)  # start the worker and load its decoder now

    def transcribe(
        self, pcm16: bytes, language: str | None = None, prompt: str | None = None
    ) -> str:
        return self._executor().submit(_transcribe, pcm16, language, prompt).result()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_load,
                    initargs=(self._factory, os.getpid()),
                )
            return self._pool


_workers: dict[Hashable, WorkerProcess] = {}
_workers_lock = threading.Lock()


def shared_worker(key: Hashable, factory: Callable[[], Decoder]) -> WorkerProcess:
    """The worker of the recogniser configuration ``key``, started once."""
    with _workers_lock:
        worker = _workers.get(key)
        if worker is None:
            worker = _workers[key] = WorkerProcess(factory)
        return worker
