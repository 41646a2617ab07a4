"""The log interface's rules, the same for every backend."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from duplex_server.jobs.blobs import BlobStore
from duplex_server.sessions.core.records import (
    AudioBody,
    CloseBody,
    ItemBody,
    OutBody,
    Record,
    SignalBody,
)
from duplex_server.sessions.log.memory_store import MemoryLog
from duplex_server.sessions.log.redis_store import RedisLog
from duplex_server.sessions.log.sqlite_store import SqliteLog
from duplex_server.sessions.log.store import (
    DuplicateEvent,
    LeaseHeld,
    SequenceConflict,
    StaleFence,
    UnknownSession,
)


@pytest.fixture(params=["memory", "sqlite", "sqlite-media", "redis", "redis-unix", "redis-media"])
async def log(request, tmp_path):
    media = BlobStore(tmp_path / "media")
    if request.param == "memory":
        backend = MemoryLog()
    elif request.param.startswith("sqlite"):
        with_media = request.param == "sqlite-media"
        backend = SqliteLog(
            tmp_path / "s.db",
            media_dir=str(media.root) if with_media else None,
            open_media=BlobStore,
        )
    else:  # redis:// takes the bare append pipe, other schemes redis-py's pipeline
        redis = request.getfixturevalue("redis_server")
        url = redis.url if request.param != "redis-unix" else redis.unix_url
        with_media = media if request.param == "redis-media" else None
        backend = RedisLog(url, prefix=f"t{uuid.uuid4().hex[:12]}", media=with_media)
    if request.param.endswith("-media"):
        # every append sealed at once, in the background: the rules hold
        # while segments are written and swapped beside the operations
        backend._sealer.seal_bytes = 0  # type: ignore[union-attr]
    yield backend
    await backend.close()


def signal(seq: int, event_id: str | None = None) -> Record:
    return Record(
        epoch=0,
        ts_ms=1,
        origin="client",
        body=SignalBody(signal="heartbeat"),
        event_id=event_id,
        seq=seq,
    )


def out(seq: int, server_event_seq: int) -> Record:
    body = OutBody(server_event_seq=server_event_seq, event_type="x", payload=b"{}")
    return Record(epoch=0, ts_ms=1, origin="server", body=body, seq=seq)


async def opened(log) -> int:
    await log.create("s")
    return await log.acquire_lease("s", "me")


async def test_seqs_are_dense_and_read_after(log):
    fence = await opened(log)
    assert await log.append("s", [signal(1), signal(2)], fence) == [1, 2]
    assert await log.append("s", [signal(3)], fence) == [3]
    assert [r.seq for r in await log.read("s", 1)] == [2, 3]


async def test_batch_must_continue_the_log(log):
    fence = await opened(log)
    await log.append("s", [signal(1)], fence)
    for bad in ([signal(1)], [signal(3)], [signal(2), signal(4)]):
        with pytest.raises(SequenceConflict):
            await log.append("s", bad, fence)
    assert [r.seq for r in await log.read("s")] == [1]


async def test_stale_fence_is_refused(log):
    old = await opened(log)
    await log.release_lease("s", "me", old)  # a shared store's lease is taken once let go
    new = await log.acquire_lease("s", "b")
    assert new > old
    with pytest.raises(StaleFence):
        await log.append("s", [signal(1)], old)
    assert await log.read("s") == []
    assert await log.append("s", [signal(1)], new) == [1]


async def test_retried_event_id_is_refused(log):
    fence = await opened(log)
    await log.append("s", [signal(1, "e1")], fence)
    with pytest.raises(DuplicateEvent) as refused:
        await log.append("s", [signal(2), signal(3, "e1")], fence)
    assert (refused.value.event_id, refused.value.seq) == ("e1", 1)  # where it landed
    assert len(await log.read("s")) == 1  # the refused batch left nothing behind
    assert await log.append("s", [signal(2, "e2")], fence) == [2]


async def test_memory_event_id_window_is_bounded():
    log = MemoryLog(event_id_window=2)
    fence = await opened(log)
    await log.append("s", [signal(1, "e1")], fence)
    await log.append("s", [signal(2, "e2")], fence)
    await log.append("s", [signal(3, "e3")], fence)
    await log.append("s", [signal(4, "e1")], fence)  # e1 fell out of the window


async def test_sqlite_remembers_only_the_heads_written_last(tmp_path):
    """The writer's cache of (fence, last_seq) stays bounded however many
    sessions it has served; a session that fell out is read back from its
    row, with its fence and its sequence checks intact."""
    log = SqliteLog(tmp_path / "s.db", max_cached_heads=3)
    fences = {}
    for n in range(10):
        await log.create(f"s{n}")
        fences[n] = await log.acquire_lease(f"s{n}", "me")
        await log.append(f"s{n}", [signal(1)], fences[n])
    assert len(log._heads) == 3
    assert await log.append("s0", [signal(2)], fences[0]) == [2]
    with pytest.raises(SequenceConflict):
        await log.append("s1", [signal(1)], fences[1])
    assert await log.acquire_lease("s2", "me", expect_fence=fences[2]) == fences[2] + 1
    with pytest.raises(StaleFence):
        await log.append("s2", [signal(2)], fences[2])
    assert len(log._heads) == 3
    await log.close()


async def test_trim_drops_payloads_but_keeps_seqs(log):
    fence = await opened(log)
    await log.append("s", [out(1, 1), signal(2), out(3, 2), out(4, 3)], fence)
    assert await log.trim("s", 2) == 2
    bodies = [r.body for r in await log.read("s")]
    assert [b.trimmed for b in bodies if isinstance(b, OutBody)] == [True, True, False]
    assert bodies[3].payload == b"{}"
    assert await log.trim("s", 2) == 0


async def test_unknown_session(log):
    with pytest.raises(UnknownSession):
        await log.read("nope")
    with pytest.raises(UnknownSession):
        await log.append("nope", [signal(1)], 1)


async def test_compaction_keeps_metadata(log):
    fence = await opened(log)
    audio = AudioBody(
        pcm=b"\x01\x00" * 100, sample_rate_hz=24000, source_format="pcm16", duration_ms=4.2
    )
    await log.append("s", [Record(epoch=0, ts_ms=1, origin="client", body=audio, seq=1)], fence)
    assert await log.compact_audio("s", 1) == 1
    (record,) = await log.read("s")
    assert record.body.pcm == b"" and record.body.duration_ms == 4.2


async def test_records_round_trip_exactly(log):
    fence = await opened(log)
    records = [signal(1, "x"), out(2, 1), signal(3)]
    await log.append("s", records, fence)
    assert await log.read("s") == records


async def test_sessions_listing(log):
    fence = await opened(log)
    close = Record(
        epoch=0, ts_ms=77, origin="manager", body=CloseBody(reason="client_close"), seq=2
    )
    await log.append("s", [signal(1), close], fence)
    await log.create("t")
    rows = {row.session_id: row for row in await log.sessions()}
    assert rows["s"].closed and rows["s"].last_ts_ms == 77 and rows["s"].last_seq == 2
    assert not rows["t"].closed
    assert [row.session_id for row in await log.sessions(open_only=True)] == ["t"]
    assert list(await log.read_open_sessions()) == ["t"]
    await log.delete("s")
    assert [row.session_id for row in await log.sessions()] == ["t"]


async def test_spelling_twins_read_back_byte_exact(log):
    """Events from the real emit path (GA + beta twins) read back exactly as sent."""
    from duplex_server.models import build_model
    from duplex_server.sessions.core.batch import Batch
    from duplex_server.sessions.core.items import Item
    from duplex_server.sessions.core.model_port import ModelChunk
    from duplex_server.sessions.core.responses import emit_chunk, start_response
    from duplex_server.sessions.core.state import initial_state

    model = build_model("echo")
    fence = await opened(log)
    state = initial_state("s", "echo")  # the log session the events belong to
    batch = Batch(state, model.capabilities, 1)
    state.items.append(Item(id="u1", role="user"))
    response = start_response(batch)
    emit_chunk(batch, response, ModelChunk(audio=b"\x01\x02" * 2400, text='héllo "x"\n'))
    await log.append("s", batch.records, fence)
    sent = [r.body.payload for r in batch.records if isinstance(r.body, OutBody)]
    for after in (0, 7, 8):
        back = [r.body.payload for r in await log.read("s", after) if isinstance(r.body, OutBody)]
        assert back == sent[len(sent) - len(back) :] and back
    await log.trim("s", 3)
    trimmed = [r.body for r in await log.read("s") if isinstance(r.body, OutBody)]
    assert [b.trimmed for b in trimmed[:3]] == [True] * 3 and not trimmed[3].trimmed


async def test_trim_and_compaction_only_move_forward(log):
    fence = await opened(log)
    audio = AudioBody(
        pcm=b"\x01\x00" * 10, sample_rate_hz=24000, source_format="pcm16", duration_ms=0.4
    )
    records = [
        out(1, 1),
        Record(epoch=0, ts_ms=1, origin="client", body=audio, seq=2),
        out(3, 2),
        Record(epoch=0, ts_ms=1, origin="client", body=audio, seq=4),
        out(5, 3),
    ]
    await log.append("s", records, fence)
    assert await log.trim("s", 1) == 1
    assert await log.trim("s", 3) == 2  # resumes after the first trim
    assert await log.trim("s", 2) == 0  # never backwards
    assert await log.compact_audio("s", 2) == 1
    assert await log.compact_audio("s", 5) == 1  # only the new range
    assert await log.compact_audio("s", 5) == 0
    bodies = [r.body for r in await log.read("s")]
    assert all(b.trimmed for b in bodies if isinstance(b, OutBody))
    assert all(not b.pcm for b in bodies if isinstance(b, AudioBody))


async def test_item_audio_round_trips_and_compacts(log):
    fence = await opened(log)
    body = ItemBody(op="create", item_id="i1", audio=[b"\x01\x02" * 8, b"\x03\x04" * 4])
    record = Record(epoch=0, ts_ms=1, origin="client", body=body, seq=1)
    await log.append("s", [record], fence)
    assert await log.read("s") == [record]
    assert await log.compact_audio("s", 1) == 1
    (back,) = await log.read("s")
    assert back.body.audio == [b"", b""] and back.body.item_id == "i1"


async def test_expected_fence_refuses_a_session_taken_since(log):
    fence = await opened(log)
    await log.release_lease("s", "me", fence)
    taken = await log.acquire_lease("s", "b")
    with pytest.raises(StaleFence):
        await log.acquire_lease("s", "me", expect_fence=fence)
    await log.release_lease("s", "b", taken)
    assert await log.acquire_lease("s", "b", expect_fence=taken) == taken + 1


async def test_renewal_keeps_a_held_lease(log):
    fence = await opened(log)
    assert await log.renew_leases("me", {"s": fence}) == {"s": "held"}
    assert await log.ping()


# --- shared-store leases (Redis): TTLs, handoff, fencing across replicas ---


@pytest.fixture
async def shared(redis_server):
    backend = RedisLog(redis_server.url, prefix=f"t{uuid.uuid4().hex[:12]}", lease_ttl_ms=300)
    yield backend
    await backend.close()


async def test_a_live_lease_is_not_taken(shared):
    await opened(shared)
    with pytest.raises(LeaseHeld) as held:
        await shared.acquire_lease("s", "b")
    assert held.value.holder == "me" and 0 < held.value.ttl_ms <= 300


async def test_a_lapsed_lease_is_taken_and_the_old_owner_learns_it(shared):
    old = await opened(shared)
    await asyncio.sleep(0.4)  # the owner stopped renewing (it died)
    new = await shared.acquire_lease("s", "b")
    assert new == old + 1
    assert await shared.renew_leases("me", {"s": old}) == {"s": "lost"}
    with pytest.raises(StaleFence):
        await shared.append("s", [signal(1)], old)
    assert await shared.append("s", [signal(1)], new) == [1]


async def test_handoff_request_reaches_the_owner(shared):
    fence = await opened(shared)
    with pytest.raises(LeaseHeld):
        await shared.acquire_lease("s", "b", handoff=True)
    assert await shared.renew_leases("me", {"s": fence}) == {"s": "handoff"}
    await shared.release_lease("s", "me", fence)
    assert await shared.acquire_lease("s", "b") == fence + 1
    assert await shared.renew_leases("b", {"s": fence + 1}) == {"s": "held"}


async def test_stream_entries_carry_the_fence_that_wrote_them(shared, redis_server):
    import redis.asyncio as aioredis

    fence = await opened(shared)
    await shared.append("s", [signal(1), signal(2)], fence)
    client = aioredis.from_url(redis_server.url)
    entries = await client.xrange(f"{shared.prefix}:{{s}}:log")
    await client.aclose()
    assert [(e[0], e[1][b"f"]) for e in entries] == [
        (b"1-0", str(fence).encode()),
        (b"2-0", str(fence).encode()),
    ]


async def test_unreachable_redis_is_storage_unavailable():
    from duplex_server.sessions.log.store import StorageUnavailable
    from tests.conftest import free_port

    log = RedisLog(f"redis://127.0.0.1:{free_port()}/0", retry_window_ms=200)
    assert not await log.ping()
    with pytest.raises(StorageUnavailable):
        await log.create("s")
    with pytest.raises(StorageUnavailable):
        await log.append("s", [signal(1)], 1)
    await log.close()


async def test_sentinel_url_finds_the_master(redis_server, tmp_path):
    """``redis+sentinel://`` asks a real redis-sentinel where the master is."""
    import subprocess

    from tests.conftest import free_port

    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor main 127.0.0.1 {redis_server.port} 1\n"
    )
    sentinel = subprocess.Popen(
        ["redis-server", str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = RedisLog(f"redis+sentinel://127.0.0.1:{port}/main/0", prefix=f"t{uuid.uuid4().hex[:8]}")
    try:
        for _ in range(100):  # the sentinel needs a moment to answer
            if await log.ping():
                break
            await asyncio.sleep(0.05)
        fence = await opened(log)
        assert await log.append("s", [signal(1, "e")], fence) == [1]
        assert [r.seq for r in await log.read("s")] == [1]
    finally:
        await log.close()
        sentinel.terminate()
        sentinel.wait(timeout=10)
