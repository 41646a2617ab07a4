"""Snapshots (docs/DECISIONS.md, "Snapshots bound a refold"): a long
session's log holds ``snapshot`` records, and a restore refolds from the
latest one plus the records after it, to exactly the state a full fold gives."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid

import pytest

from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from duplex_server.sessions.core.records import Record, SignalBody, SnapshotBody, UnitBody
from duplex_server.sessions.core.state import decode_snapshot, encode_snapshot, fold, initial_state
from duplex_server.sessions.log.memory_store import MemoryLog
from duplex_server.sessions.log.redis_store import RedisLog
from duplex_server.sessions.log.sqlite_store import SqliteLog
from duplex_server.sessions.log.store import StaleFence
from duplex_server.sessions.runtime.journal import Journal
from duplex_server.sessions.runtime.recovery import (
    fold_tail,
    journal_entries,
    media_bytes,
    read_tail,
    recent_turn_audio,
    stepped_units,
)
from tests.conftest import running_server
from tests.wsclient import tone_pcm16

EVERY = 300
TURNS = 24
APPENDS_PER_TURN = 50


def _initial(server, session_id: str):
    model = server.app.state.model
    return initial_state(session_id, model.name, model.turn_detection_types)


async def _long_session(server) -> str:
    """Thousands of records through the real server: appends, commits, and
    the echo model's answers (out records)."""
    client, created = await server.open()
    session_id = created["session"]["id"]
    await client.send({"type": "session.update", "session": {"turn_detection": None}})
    await client.recv_until("session.updated")
    chunk = tone_pcm16(20)
    for turn in range(TURNS):
        for i in range(APPENDS_PER_TURN):
            await client.append(chunk, event_id=f"a{turn}-{i}")
        await client.send({"type": "input_audio_buffer.commit"})
        await client.send({"type": "response.create"})
        events = await client.recv_until("response.done")
        # An acknowledging client: the journal (and so a restore's tail) holds
        # only what it has not acknowledged.
        ack = {"type": "session.event_ack", "server_event_seq": events[-1]["server_event_seq"]}
        await client.send(ack)
    await client.close()
    actor = server.manager.actors[session_id]
    while actor.state.lease.attached:  # the detach is the session's last record
        await asyncio.sleep(0.01)
    return session_id


@pytest.mark.server_config(snapshot_every=EVERY, max_input_realtime_factor=0)
async def test_a_refold_from_the_latest_snapshot_equals_the_full_fold(server):
    session_id = await _long_session(server)
    log = server.app.state.log
    actor = server.manager.actors[session_id]
    full = await log.read(session_id)
    assert len(full) > 2000
    at = [i for i, record in enumerate(full) if isinstance(record.body, SnapshotBody)]
    assert len(at) >= len(full) // (EVERY + 50)
    for index in at:  # each snapshot is the exact fold of what precedes it
        before = fold(full[:index], _initial(server, session_id))
        assert decode_snapshot(full[index].body) == before
        assert encode_snapshot(decode_snapshot(full[index].body)) == encode_snapshot(before)
    assert await log.latest_snapshot(session_id) == full[at[-1]].seq

    tail = await read_tail(log, session_id)
    assert len(tail) < len(full) // 2  # read from the snapshot (and its tail_from), not seq 1
    assert tail[-1].seq == full[-1].seq
    from_snapshot = fold_tail(tail, _initial(server, session_id))
    whole = fold(full, _initial(server, session_id))
    assert from_snapshot == whole == actor.state
    assert encode_snapshot(from_snapshot) == encode_snapshot(whole)

    # What a restored actor reads from the log besides the state is the same.
    assert recent_turn_audio(whole, tail, 8) == recent_turn_audio(whole, full, 8)
    assert all(pcm for _, pcm in recent_turn_audio(whole, tail, 8))
    assert media_bytes(tail) == media_bytes(full)
    journals = []
    for records in (tail, full):
        journal = Journal(actor.journal.max_events, max_bytes=actor.journal.max_bytes)
        journal.restore(journal_entries(records), whole.server_event_seq)
        journals.append(journal.since(journal.dropped_upto))
    assert journals[0] == journals[1] == actor.journal.since(actor.journal.dropped_upto)

    # The history routes still show every record, snapshots among them.
    url = f"{server.http_url}/v1/sessions/{session_id}/events"
    lines = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read())
    kinds = [json.loads(line)["kind"] for line in lines.splitlines()]
    assert len(kinds) == len(full) and kinds.count("snapshot") == len(at)


@pytest.mark.server_config(snapshot_every=EVERY, max_input_realtime_factor=0)
async def test_recovery_restores_from_the_snapshot(server):
    session_id = await _long_session(server)
    log = server.app.state.log
    manager = server.manager
    live = manager.actors[session_id].state
    full = await log.read(session_id)
    read = await manager._read_tail(session_id)  # what recovery and takeover restore from
    assert len(read) < len(full) // 2
    actor = manager._actor(session_id)
    actor.writer.restore(read)
    assert actor.writer.state == live
    assert actor.journal.since(actor.journal.dropped_upto) == manager.actors[
        session_id
    ].journal.since(actor.journal.dropped_upto)


def _signal(seq: int) -> Record:
    return Record(epoch=0, ts_ms=1, origin="server", body=SignalBody(signal="barge_in"), seq=seq)


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(request, tmp_path):
    if request.param == "memory":
        backend = MemoryLog()
    elif request.param == "sqlite":
        backend = SqliteLog(tmp_path / "s.db")
    else:
        redis = request.getfixturevalue("redis_server")
        backend = RedisLog(redis.url, prefix=f"t{uuid.uuid4().hex[:12]}")
    yield backend
    await backend.close()


async def test_a_deposed_writer_cannot_write_a_snapshot(store):
    await store.create("s")
    old = await store.acquire_lease("s", "a")
    await store.append("s", [_signal(1), _signal(2)], old)
    assert await store.acquire_lease("s", "a") > old  # a newer owner (the same name: no wait)
    state = fold(await store.read("s"), initial_state("s", "echo"))
    snapshot = Record(0, 1, "server", SnapshotBody(state=encode_snapshot(state)), seq=3)
    with pytest.raises(StaleFence):
        await store.append("s", [snapshot], old)
    assert await store.latest_snapshot("s") == 0
    assert [r.seq for r in await store.read("s")] == [1, 2]


async def test_an_old_log_without_snapshots_still_refolds(store):
    await store.create("s")
    fence = await store.acquire_lease("s", "a")
    await store.append("s", [_signal(seq) for seq in range(1, 51)], fence)
    assert await store.latest_snapshot("s") == 0
    tail = await read_tail(store, "s")
    assert [r.seq for r in tail] == list(range(1, 51))
    assert fold_tail(tail, initial_state("s", "echo")) == fold(tail, initial_state("s", "echo"))


async def test_a_snapshot_is_found_on_every_store(store):
    await store.create("s")
    fence = await store.acquire_lease("s", "a")
    await store.append("s", [_signal(seq) for seq in range(1, 11)], fence)
    state = fold(await store.read("s"), initial_state("s", "echo"))
    snapshot = Record(0, 1, "server", SnapshotBody(state=encode_snapshot(state)), seq=11)
    await store.append("s", [snapshot], fence)
    await store.append("s", [_signal(12)], fence)
    assert await store.latest_snapshot("s") == 11
    tail = await read_tail(store, "s")
    assert [r.seq for r in tail] == [11, 12]
    full = await store.read("s")
    assert fold_tail(tail, initial_state("s", "echo")) == fold(full, initial_state("s", "echo"))


async def test_a_restarted_server_recovers_a_long_session_from_its_snapshot(tmp_path):
    """A real restart on the same SQLite file: startup recovery rebuilds the
    session from what ``read_tail`` gives, fewer records than the log holds,
    to the state a full fold of the log gives."""
    store = f"sqlite:{tmp_path / 'sessions.db'}"
    options = {"snapshot_every": EVERY, "max_input_realtime_factor": 0, "model": "echo"}
    async with running_server(ServerConfig(port=free_port(), store=store, **options)) as first:
        session_id = await _long_session(first)
        before = len(await first.app.state.log.read(session_id))
        tail = len(await first.manager._read_tail(session_id))
        await first.manager.shutdown()  # a durable store: suspended, not closed
    assert tail < before // 2
    async with running_server(ServerConfig(port=free_port(), store=store, **options)) as second:
        actor = second.manager.actors[session_id]  # recovered at startup
        full = await second.app.state.log.read(session_id)
        assert len(full) > before  # the recovery's own records landed
        assert actor.state == fold(full, _initial(second, session_id))
        assert actor.state.items == fold(full[:before], _initial(second, session_id)).items
        await second.manager.shutdown()


async def test_a_native_models_window_reaches_back_past_the_snapshot(store):
    """A native model rebuilds from its latest ``resume_units`` units: the
    tail reaches back for them, however far before the snapshot they lie."""
    await store.create("s")
    fence = await store.acquire_lease("s", "a")
    units = [
        Record(0, 1, "engine", UnitBody(index=i, tokens=[i], pcm=bytes([i % 256]) * 8), seq=i + 1)
        for i in range(300)
    ]
    signals = [_signal(seq) for seq in range(301, 401)]
    await store.append("s", units + signals, fence)
    state = fold(await store.read("s"), initial_state("s", "echo"))
    snapshot = SnapshotBody(state=encode_snapshot(state), tail_from=401)
    await store.append("s", [Record(0, 1, "server", snapshot, seq=401)], fence)
    assert len(stepped_units(await read_tail(store, "s"))) == 0
    window = stepped_units(await read_tail(store, "s", units=120))
    assert len(window) >= 120 and window[-120:] == [u.body for u in units[-120:]]
    assert stepped_units(await read_tail(store, "s", units=1000)) == [u.body for u in units]
