"""Retention: audio compaction, bounded journals, deletion of closed sessions."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.wsclient import tone_pcm16


@pytest.mark.server_config(retain_audio="uncommitted")
async def test_acknowledged_turn_audio_is_compacted(server):
    client, created = await server.open()
    session_id = created["session"]["id"]
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit"})
    turn = await client.recv_until("rate_limits.updated")
    await client.append(tone_pcm16(100))  # not committed: must survive
    committed = next(e for e in turn if e["type"] == "input_audio_buffer.committed")
    await client.send(
        {"type": "session.event_ack", "server_event_seq": committed["server_event_seq"]}
    )
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")
    records = await server.app.state.log.read(session_id)
    audio = [r.body for r in records if r.kind == "audio"]
    assert [len(a.pcm) for a in audio] == [0, len(tone_pcm16(100))]
    assert audio[0].duration_ms == 200.0  # metadata stays
    # The uncommitted audio still answers, and the refold at teardown must
    # equal the live state although the first turn's samples are gone.
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("response.done")
    assert events[-1]["response"]["duplex"]["playback"]["generated_ms"] == 100.0


async def _audio_lengths(server, session_id: str) -> list[int]:
    await asyncio.sleep(0)
    records = await server.app.state.log.read(session_id)
    return [len(r.body.pcm) for r in records if r.kind == "audio"]


async def _left(server, session_id: str) -> None:
    for _ in range(200):  # the actor leaves once its close is logged
        if session_id not in server.manager.actors:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"session {session_id} did not leave")


@pytest.mark.server_config(retain_audio="none")
async def test_keeping_no_audio_drops_it_once_the_buffer_ends_and_at_close(server):
    """No acknowledgement needed: a commit or a clear ends the buffer and its
    samples go; at close the rest goes, and the answers' payloads with it,
    every record and its metadata (durations, transcripts) staying."""
    client, created = await server.open()
    session_id = created["session"]["id"]
    heartbeat = {"type": "session.heartbeat"}
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.recv_until("rate_limits.updated")
    await client.append(tone_pcm16(100))  # not committed: must survive
    await client.send(heartbeat)
    await client.expect("session.heartbeat_ack")
    assert await _audio_lengths(server, session_id) == [0, len(tone_pcm16(100))]

    await client.send({"type": "input_audio_buffer.clear"})
    await client.append(tone_pcm16(300))
    await client.send(heartbeat)
    await client.recv_until("session.heartbeat_ack")
    assert await _audio_lengths(server, session_id) == [0, 0, len(tone_pcm16(300))]

    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("response.done")
    assert events[-1]["response"]["duplex"]["playback"]["generated_ms"] == 300.0
    await client.send({"type": "session.close"})
    await client.recv_until("session.closed")
    await _left(server, session_id)
    # the memory store drops a closed session at once (the fixture keeps its records)
    records = server.final_records.get(session_id) or await server.app.state.log.read(session_id)
    audio = [r.body for r in records if r.kind == "audio"]
    assert [a.duration_ms for a in audio] == [200.0, 100.0, 300.0]
    assert not any(a.pcm for a in audio)
    outs = [r.body for r in records if r.kind == "out"]
    assert outs and all(o.trimmed and not o.payload for o in outs)
    answered = [o for o in outs if o.event_type == "response.output_audio.delta"]
    # both answers' lengths (the echo says each turn back), not how they sounded
    assert sum(o.audio_ms for o in answered) == 200.0 + 300.0


async def test_audio_is_kept_by_default(server):
    client, created = await server.open()
    await client.append(tone_pcm16(100))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    await client.send(
        {"type": "session.event_ack", "server_event_seq": events[-1]["server_event_seq"]}
    )
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")
    records = await server.app.state.log.read(created["session"]["id"])
    assert all(r.body.pcm for r in records if r.kind == "audio")


@pytest.mark.server_config(journal_max_events=3)
async def test_overflowing_journal_asks_for_resync(server):
    client, _ = await server.open()
    await client.append(tone_pcm16(300))
    await client.send({"type": "input_audio_buffer.commit"})
    resync = await client.recv_until("session.resync_required")
    notice = resync[-1]
    assert notice["reason"] == "journal_overflow"
    assert notice["session"]["turn_id"] == 1
    # The session keeps serving after the notice.
    await client.send({"type": "session.heartbeat"})
    events = await client.recv_until("session.heartbeat_ack")
    assert events[-1]["type"] == "session.heartbeat_ack"


@pytest.mark.server_config(retention_s=0.2, purge_interval_s=0.05, reap_interval_s=0.05)
async def test_closed_sessions_are_deleted_after_retention(server):
    """A durable store keeps a closed session for the retention; the memory
    store, which nothing outlives, drops it at close."""
    client, created = await server.open()
    session_id = created["session"]["id"]
    await client.send({"type": "session.close"})
    await client.expect("session.closed")
    kept, _ = await server.open()  # an open session is never purged
    url = f"/v1/sessions/{session_id}/events"
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        if server.app.state.log.durable:
            assert (await http.get(url)).status_code == 200
        for _ in range(100):
            await asyncio.sleep(0.05)
            if (await http.get(url)).status_code == 404:
                break
        assert (await http.get(url)).status_code == 404
    server.final_states.pop(session_id)  # nothing left to refold: that is the point
    await kept.send({"type": "session.heartbeat"})
    await kept.expect("session.heartbeat_ack")


async def closed_sessions(server, count: int) -> list[str]:
    """Open and close ``count`` sessions; their ids once their actors left."""
    closed = []
    for _ in range(count):
        client, created = await server.open()
        await client.send({"type": "session.close"})
        await client.expect("session.closed")
        closed.append(created["session"]["id"])
    for _ in range(200):  # the actors leave once their close is logged
        if not set(closed) & set(server.manager.actors):
            break
        await asyncio.sleep(0.01)
    return closed


class CountedDeletes:
    """Wraps the store's ``delete``: how many run at once, now and at most."""

    def __init__(self, log) -> None:
        self._delete = log.delete
        self.in_flight = 0
        self.most = 0
        log.delete = self

    async def __call__(self, session_id: str) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self._delete(session_id)
        finally:
            self.in_flight -= 1


def forget(server, session_ids: list[str]) -> None:
    """Purged sessions have no log left to refold at teardown."""
    for session_id in session_ids:
        server.final_states.pop(session_id, None)


async def test_the_purge_deletes_sessions_together(server):
    """Expired sessions are deleted concurrently, to share the store's group
    commits or round trips: one at a time, a busy server's purge fell behind
    the sessions it served and its store grew without bound."""
    if not server.app.state.log.durable:
        return  # the memory store deletes at close: nothing is left to purge
    closed = await closed_sessions(server, 4)
    deletes = CountedDeletes(server.app.state.log)
    purged = await server.manager.purge(now_ms=2**62)  # every closed session is past its retention
    assert set(closed) <= set(purged)
    assert deletes.most == len(purged) > 1
    forget(server, closed)


async def test_the_purge_deletes_in_small_paced_batches(server, monkeypatch):
    """A batch of deletes at a time, then a pause as long as the batch took
    (PURGE_DUTY 0.5): a live append never queues behind more than one batch."""
    if not server.app.state.log.durable:
        return  # the memory store deletes at close: nothing is left to purge
    from duplex_server.sessions.runtime import manager as manager_module

    closed = await closed_sessions(server, 5)
    deletes, pauses = CountedDeletes(server.app.state.log), []

    async def pause(seconds: float) -> None:
        pauses.append((seconds, deletes.in_flight))

    monkeypatch.setattr(manager_module, "PURGE_BATCH", 2)
    monkeypatch.setattr(manager_module, "purge_pause", pause)
    purged = await server.manager.purge(now_ms=2**62)
    monkeypatch.undo()
    assert set(closed) <= set(purged)
    batches = -(-len(purged) // 2)
    assert deletes.most == 2 and len(pauses) == batches - 1
    assert all(seconds >= 0 and busy == 0 for seconds, busy in pauses)  # between batches
    forget(server, closed)
