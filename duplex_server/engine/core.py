"""``EngineCore.submit(request) -> async iterator of chunks`` and ``abort``.

Requests wait for one of ``max_concurrency`` slots; realtime requests go
ahead of batch work, FIFO within a priority. Aborting a request that is
still waiting removes it; aborting a running one stops its stream at the
next chunk.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Generic, Protocol, TypeVar

from duplex_server import metrics

P = TypeVar("P")
C = TypeVar("C")
# A backend yields chunks: covariant in them.
C_out = TypeVar("C_out", covariant=True)


class Priority(IntEnum):
    REALTIME = 0
    BATCH = 1


@dataclass
class EngineRequest(Generic[P]):
    request_id: str
    session_id: str
    response_id: str
    epoch: int
    payload: P
    priority: Priority = Priority.REALTIME


class EngineBackend(Protocol[P, C_out]):
    def generate(self, request: EngineRequest[P]) -> AsyncIterator[C_out]: ...


class RequestAborted(Exception):
    pass


@dataclass(order=True)
class _Waiter:
    priority: int
    order: int
    request_id: str = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


class EngineCore(Generic[P, C]):
    """``name`` labels its queue depth in ``/metrics``."""

    def __init__(
        self, backend: EngineBackend[P, C], max_concurrency: int = 64, name: str = "engine"
    ) -> None:
        self.backend = backend
        self.name = name
        self._depth = metrics.ENGINE_QUEUE_DEPTH.labels(name)
        self.max_concurrency = max_concurrency
        self._running: set[str] = set()
        self._aborted: set[str] = set()
        self._waiting: list[_Waiter] = []
        self._order = itertools.count()
        self.completed = 0

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def queued(self) -> int:
        return sum(1 for w in self._waiting if not w.future.done())

    async def submit(self, request: EngineRequest[P]) -> AsyncIterator[C]:
        await self._acquire(request)
        try:
            chunks = self.backend.generate(request)
            try:
                async for chunk in chunks:
                    if request.request_id in self._aborted:
                        raise RequestAborted(request.request_id)
                    yield chunk
            finally:
                # Closed now, not whenever it is collected: a backend stops
                # decoding the request as its stream closes.
                if isinstance(chunks, AsyncGenerator):
                    await chunks.aclose()
            self.completed += 1
        finally:
            self._release(request.request_id)

    def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)
            return
        for waiter in self._waiting:
            if waiter.request_id == request_id and not waiter.future.done():
                waiter.future.set_exception(RequestAborted(request_id))

    async def _acquire(self, request: EngineRequest[P]) -> None:
        if len(self._running) < self.max_concurrency and not self.queued:
            self._running.add(request.request_id)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(
            self._waiting,
            _Waiter(int(request.priority), next(self._order), request.request_id, future),
        )
        self._depth.set(len(self._waiting))
        await future  # resolved by _release, with the slot already ours

    def _release(self, request_id: str) -> None:
        self._running.discard(request_id)
        self._aborted.discard(request_id)
        while self._waiting and len(self._running) < self.max_concurrency:
            waiter = heapq.heappop(self._waiting)
            if waiter.future.done():
                continue  # aborted or cancelled while waiting
            self._running.add(waiter.request_id)
            waiter.future.set_result(None)
        self._depth.set(len(self._waiting))
