"""Step-wise work on a thread of its own, seen from the event loop as an
async stream of progress and then the result.

A denoising loop holds its thread for seconds to minutes; it reports each
finished step through :class:`Progress`, and the same call is where it
stops once the caller is gone (an aborted request, a closed stream): the
next step raises :class:`Cancelled` inside the pipeline, so an abort costs
at most one step of compute."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from duplex_server.engine.diffusion.jobs import Step

R = TypeVar("R")


class Cancelled(Exception):
    """Raised on the worker thread at the step after a cancel."""


class Progress:
    def __init__(self, report: Callable[[Step], None]) -> None:
        self._report = report
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def step(self, done: int, total: int) -> None:
        """Called by the work after each step, on its thread."""
        if self._cancelled.is_set():
            raise Cancelled()
        self._report(Step(done, total))


class _Finished(Generic[R]):
    def __init__(self, value: R) -> None:
        self.value = value


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class StepThread:
    """One thread: jobs run on it one at a time, in the order submitted."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def call(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Plain blocking work (loading the pipeline) on the same thread."""
        return self._pool.submit(fn, *args)

    async def run(self, work: Callable[[Progress], R]) -> AsyncIterator[Step | R]:
        """``work``'s steps as they finish, then its result (its exception
        is raised here). Leaving the iteration early cancels it."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Step | _Finished[R] | _Failed] = asyncio.Queue()

        def report(item: Step | _Finished[R] | _Failed) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        progress = Progress(report)

        def body() -> None:
            try:
                report(_Finished(work(progress)))
            except BaseException as exc:  # handed to the awaiting side, which raises it
                report(_Failed(exc))

        self._pool.submit(body)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _Failed):
                    raise item.error
                if isinstance(item, _Finished):
                    yield item.value
                    return
                yield item
        finally:
            progress.cancel()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
