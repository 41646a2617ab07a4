"""Audio stages as engine workers: one loaded model, its own threads (one,
unless the model runs several calls at once), requests scheduled by the
engine core.

Each call on a stage is an engine request (``max_concurrency`` is the
stage's worker count: most libraries are not thread-safe, one is the
default), so realtime work (a turn's final transcript,
VAD scores, speech for an answer) goes ahead of background work (partial
transcripts) in the core's priority queue.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from duplex_server.engine.core import EngineCore, EngineRequest, Priority

T = TypeVar("T")


@dataclass
class StageCall:
    fn: Callable[..., Any]
    args: tuple[Any, ...]


class _ThreadBackend:
    """Engine backend running each request's call on the stage's one thread."""

    def __init__(self, name: str, workers: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    async def generate(self, request: EngineRequest[StageCall]) -> AsyncIterator[Any]:
        call = request.payload
        yield await asyncio.get_running_loop().run_in_executor(self._pool, call.fn, *call.args)


class Stage:
    def __init__(self, name: str, workers: int = 1) -> None:
        self.name = name
        self.engine: EngineCore[StageCall, Any] = EngineCore(
            _ThreadBackend(name, workers), max_concurrency=workers, name=name
        )
        self._ids = itertools.count()

    @property
    def pending(self) -> int:
        """Requests running or waiting."""
        return self.engine.running + self.engine.queued

    async def run(
        self, fn: Callable[..., T], *args: Any, priority: Priority = Priority.REALTIME
    ) -> T:
        request = EngineRequest(
            request_id=f"{self.name}-{next(self._ids)}",
            session_id="",
            response_id="",
            epoch=0,
            payload=StageCall(fn, args),
            priority=priority,
        )
        async for result in self.engine.submit(request):
            return result
        raise RuntimeError(f"stage {self.name} returned nothing")  # generate always yields
