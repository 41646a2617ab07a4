"""The log interface's rules on the memory backend."""

from __future__ import annotations

import pytest

from duplex_server.sessions.log import DuplicateEvent, StaleFence, UnknownSession
from duplex_server.sessions.memory_log import MemoryLog
from duplex_server.sessions.records import OutBody, Record, SignalBody


def signal(event_id: str | None = None) -> Record:
    return Record(
        epoch=0, ts_ms=1, origin="client", body=SignalBody(signal="heartbeat"), event_id=event_id
    )


def out(seq: int) -> Record:
    return Record(
        epoch=0,
        ts_ms=1,
        origin="server",
        body=OutBody(server_event_seq=seq, event_type="x", payload=b"{}"),
    )


async def test_seqs_are_dense_and_read_after():
    log = MemoryLog()
    await log.create("s")
    fence = await log.acquire_lease("s", "me")
    assert await log.append("s", [signal(), signal()], fence) == [1, 2]
    assert await log.append("s", [signal()], fence) == [3]
    assert [r.seq for r in await log.read("s", 1)] == [2, 3]


async def test_stale_fence_is_refused():
    log = MemoryLog()
    await log.create("s")
    old = await log.acquire_lease("s", "a")
    new = await log.acquire_lease("s", "b")
    assert new > old
    with pytest.raises(StaleFence):
        await log.append("s", [signal()], old)
    assert await log.read("s") == []
    assert await log.append("s", [signal()], new) == [1]


async def test_event_id_window():
    log = MemoryLog(event_id_window=2)
    await log.create("s")
    fence = await log.acquire_lease("s", "a")
    await log.append("s", [signal("e1")], fence)
    with pytest.raises(DuplicateEvent):
        await log.append("s", [signal(), signal("e1")], fence)
    assert len(await log.read("s")) == 1  # the refused batch left nothing behind
    await log.append("s", [signal("e2")], fence)
    await log.append("s", [signal("e3")], fence)
    await log.append("s", [signal("e1")], fence)  # e1 fell out of the window


async def test_trim_drops_payloads_but_keeps_seqs():
    log = MemoryLog()
    await log.create("s")
    fence = await log.acquire_lease("s", "a")
    await log.append("s", [out(1), signal(), out(2), out(3)], fence)
    assert await log.trim("s", 2) == 2
    bodies = [r.body for r in await log.read("s")]
    assert [b.trimmed for b in bodies if isinstance(b, OutBody)] == [True, True, False]
    assert bodies[3].payload == b"{}"
    assert await log.trim("s", 2) == 0


async def test_unknown_session():
    with pytest.raises(UnknownSession):
        await MemoryLog().read("nope")
