"""Cross-session scheduling in the engine core."""

from __future__ import annotations

import asyncio

import pytest

from duplex_server.engine import EngineCore, EngineRequest, Priority
from duplex_server.engine.core import RequestAborted


class Steps:
    """A backend yielding ``payload`` chunks, each after the test releases a gate."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gate = asyncio.Event()

    async def generate(self, request):
        self.started.append(request.request_id)
        for index in range(request.payload):
            await self.gate.wait()
            yield (request.request_id, index)


def req(rid: str, chunks: int = 1, priority: Priority = Priority.REALTIME) -> EngineRequest:
    return EngineRequest(
        request_id=rid, session_id="s", response_id=rid, epoch=0, payload=chunks, priority=priority
    )


async def drain(core, request):
    return [chunk async for chunk in core.submit(request)]


async def test_concurrency_limit_and_realtime_first():
    backend = Steps()
    core = EngineCore(backend, max_concurrency=1)
    first = asyncio.create_task(drain(core, req("first")))
    await asyncio.sleep(0)
    batch = asyncio.create_task(drain(core, req("batch", priority=Priority.BATCH)))
    live = asyncio.create_task(drain(core, req("live")))
    await asyncio.sleep(0.01)
    assert backend.started == ["first"] and core.queued == 2
    backend.gate.set()
    await asyncio.gather(first, batch, live)
    assert backend.started == ["first", "live", "batch"]
    assert core.completed == 3 and core.running == 0


async def test_many_sessions_run_concurrently():
    backend = Steps()
    core = EngineCore(backend, max_concurrency=8)
    tasks = [asyncio.create_task(drain(core, req(f"r{i}", 3))) for i in range(8)]
    await asyncio.sleep(0.01)
    assert len(backend.started) == 8
    backend.gate.set()
    results = await asyncio.gather(*tasks)
    assert all(len(chunks) == 3 for chunks in results)


async def test_abort_running_and_waiting():
    backend = Steps()
    core = EngineCore(backend, max_concurrency=1)
    running = asyncio.create_task(drain(core, req("run", 5)))
    waiting = asyncio.create_task(drain(core, req("wait")))
    await asyncio.sleep(0.01)
    core.abort("wait")
    core.abort("run")
    backend.gate.set()
    with pytest.raises(RequestAborted):
        await running
    with pytest.raises(RequestAborted):
        await waiting
    assert core.running == 0 and core.queued == 0
    assert await drain(core, req("after")) == [("after", 0)]
