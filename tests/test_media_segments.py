"""Audio out of the hot log (issue 41, sessions/log/media.py): with a media
folder, a Redis session's bulk (input audio, a native model's units, event
payloads) moves into segment files and Redis keeps references; every read
gives back the records as they were appended; a missing or corrupt segment
is reported, never replaced; a crash at any step loses nothing."""

from __future__ import annotations

import uuid

import pytest
import redis as redis_client

from duplex_server import metrics
from duplex_server.jobs.blobs import BlobStore
from duplex_server.sessions.core.records import (
    AudioBody,
    ItemBody,
    OutBody,
    Record,
    SnapshotBody,
    UnitBody,
)
from duplex_server.sessions.log.media import MediaUnavailable
from duplex_server.sessions.log.redis_store import RedisLog
from duplex_server.sessions.log.store import StorageUnavailable

CHUNK = bytes(range(256)) * 19  # 4,864 bytes: 100 ms of 24 kHz pcm16, not silence


def _audio(seq: int, n: int) -> Record:
    pcm = CHUNK[n % 7 :] + CHUNK[: n % 7]
    body = AudioBody(pcm=pcm, sample_rate_hz=24000, source_format="pcm16", duration_ms=100.0)
    return Record(epoch=0, ts_ms=seq, origin="client", body=body, seq=seq, event_id=f"e{seq}")


def _out(seq: int, server_event_seq: int) -> Record:
    payload = b'{"type":"response.output_audio.delta","delta":"' + b"QUJD" * 600 + b'"}'
    body = OutBody(
        server_event_seq=server_event_seq,
        event_type="response.output_audio.delta",
        payload=payload,
        audio_ms=100.0,
    )
    return Record(epoch=0, ts_ms=seq, origin="server", body=body, seq=seq)


def _unit(seq: int, index: int) -> Record:
    body = UnitBody(index=index, tokens=[1, 2, 3], pcm=CHUNK[:3840])
    return Record(epoch=0, ts_ms=seq, origin="server", body=body, seq=seq)


def _conversation(first: int = 1, turns: int = 10) -> list[Record]:
    records, seq, n, event = [], first, 0, 0
    for _ in range(turns):
        for _ in range(8):
            records.append(_audio(seq, n))
            seq, n = seq + 1, n + 1
        for _ in range(3):
            event += 1
            records.append(_out(seq, event))
            seq += 1
        records.append(_unit(seq, n))
        seq += 1
    item = ItemBody(op="create", item_id="i1", audio=[CHUNK[:100], CHUNK[:50]])
    records.append(Record(epoch=0, ts_ms=seq, origin="client", body=item, seq=seq))
    return records


def _bulk_of(body) -> bytes:
    if isinstance(body, (AudioBody, UnitBody)):
        return body.pcm
    if isinstance(body, OutBody):
        return body.payload
    return b"".join(body.audio)


@pytest.fixture
def prefix():
    return f"m{uuid.uuid4().hex[:10]}"


def _log(redis_server, prefix: str, media_dir) -> RedisLog:
    return RedisLog(redis_server.url, prefix=prefix, media=BlobStore(media_dir))


def _bulk(redis_server, prefix: str) -> dict[bytes, bytes]:
    return redis_client.Redis.from_url(redis_server.url).hgetall(f"{prefix}:{{s}}:bulk")


async def _opened(log: RedisLog) -> int:
    await log.create("s")
    return await log.acquire_lease("s", "me")


async def test_sealed_bulk_leaves_references_and_reads_back_whole(redis_server, prefix, tmp_path):
    log = _log(redis_server, prefix, tmp_path / "media")
    fence = await _opened(log)
    records = _conversation()
    for at in range(0, len(records), 4):  # batches, as a session appends them
        await log.append("s", records[at : at + 4], fence)
    await log.seal_media()  # some were sealed already, as the appends went on
    bulk = _bulk(redis_server, prefix)
    assert bulk and all(name[:1] in b"AOU" for name in bulk), sorted(bulk)[:5]
    sealed = sum(len(v) for v in bulk.values())
    whole = sum(len(_bulk_of(r.body)) for r in records)
    assert sealed * 20 < whole, (sealed, whole)  # about 45 bytes a reference, not kilobytes
    assert await log.read("s") == records
    assert await log.read("s", after_seq=30) == records[30:]
    await log.close()
    # another process (a restart, another replica) reads them back the same
    again = _log(redis_server, prefix, tmp_path / "media")
    assert await again.read("s") == records
    await again.close()


async def test_retention_drops_sealed_values_as_it_drops_whole_ones(redis_server, prefix, tmp_path):
    log = _log(redis_server, prefix, tmp_path / "media")
    fence = await _opened(log)
    await retention_checked(log, fence)
    await log.close()


async def retention_checked(log, fence: int) -> None:
    """Two turns appended and sealed, then trimmed and compacted: what
    retention dropped reads back dropped, sealed or not, the rest whole."""
    records = _conversation(turns=2)
    await log.append("s", records, fence)
    await log.seal_media()
    assert await log.trim("s", 3) > 0  # the first three payloads, acknowledged
    await log.compact_audio("s", 8)  # the first turn's input
    back = await log.read("s")
    outs = [r.body for r in back if isinstance(r.body, OutBody)]
    assert [b.trimmed for b in outs] == [True] * 3 + [False] * 3
    assert outs[3].payload == records[20].body.payload
    audio = [r.body for r in back if isinstance(r.body, AudioBody)]
    assert [bool(b.pcm) for b in audio] == [False] * 8 + [True] * 8
    units = [r.body for r in back if isinstance(r.body, UnitBody)]
    assert all(u.pcm == CHUNK[:3840] for u in units)  # units are never compacted with input


@pytest.mark.parametrize("damage", ["deleted", "corrupt"])
async def test_a_damaged_segment_is_reported_by_name(redis_server, prefix, tmp_path, damage):
    media = tmp_path / "media"
    log = _log(redis_server, prefix, media)
    fence = await _opened(log)
    await log.append("s", _conversation(turns=1), fence)
    await log.seal_media()
    (segment,) = [p for p in media.glob("??/*") if p.is_file()]
    if damage == "deleted":
        segment.unlink()
    else:
        segment.write_bytes(b"x" + segment.read_bytes()[1:])
    fresh = _log(redis_server, prefix, media)  # nothing cached
    with pytest.raises(MediaUnavailable, match=segment.name) as failed:
        await fresh.read("s")
    assert isinstance(failed.value, StorageUnavailable)  # the session answers storage_unavailable
    await fresh.close()
    await log.close()


class _CrashBeforeSwap(RedisLog):
    """A process killed after its segment was written, before the swap."""

    async def swap_bulk(self, session_id: str, refs: dict[str, bytes]) -> int:
        raise StorageUnavailable("killed")


async def test_a_crash_between_segment_and_swap_loses_nothing(redis_server, prefix, tmp_path):
    media = tmp_path / "media"
    crashed = _CrashBeforeSwap(redis_server.url, prefix=prefix, media=BlobStore(media))
    fence = await _opened(crashed)
    records = _conversation(turns=3)
    await crashed.append("s", records, fence)
    await crashed.seal_media()
    assert list(media.glob("??/*"))  # the segment was written: an orphan now
    assert all(name[:1] in b"aou" for name in _bulk(redis_server, prefix))
    # the next process reads the session (recovery), gets it whole, and seals it
    after = _log(redis_server, prefix, media)
    assert await after.read("s") == records
    await after.seal_media()
    assert all(name[:1] in b"AOU" for name in _bulk(redis_server, prefix))
    assert await after.read("s") == records
    await after.close()


async def test_a_segment_that_cannot_be_written_leaves_the_bulk_in_redis(
    redis_server, prefix, tmp_path, caplog
):
    media = tmp_path / "media"
    log = _log(redis_server, prefix, media)
    fence = await _opened(log)
    (media / "tmp").rmdir()
    (media / "tmp").write_bytes(b"")  # where segments are written first: unusable now
    records = _conversation(turns=1)
    await log.append("s", records, fence)
    failed = metrics.STORE_ERRORS.labels("seal_media")._value.get()
    await log.seal_media()
    assert all(name[:1] in b"aou" for name in _bulk(redis_server, prefix))
    assert await log.read("s") == records
    # said, in the log and in /metrics: the store's memory grows meanwhile
    assert metrics.STORE_ERRORS.labels("seal_media")._value.get() > failed
    assert any("could not seal" in r.message and "session s " in r.message for r in caplog.records)
    await log.close()


def _snapshot(seq: int) -> Record:
    body = SnapshotBody(state=b"\x80", tail_from=seq)
    return Record(epoch=0, ts_ms=seq, origin="server", body=body, seq=seq)


async def test_records_long_behind_a_snapshot_leave_the_stream_and_read_back(
    redis_server, prefix, tmp_path
):
    log = _log(redis_server, prefix, tmp_path / "media")
    fence = await _opened(log)
    records = _conversation(turns=220)[:2600]
    for seq in (1200, 2400):  # two snapshots, the first 1,199 records behind the second
        records[seq - 1] = _snapshot(seq)
    for at in range(0, len(records), 20):
        await log.append("s", records[at : at + 20], fence)
    await log.seal_media()
    await log.trim("s", 30)  # acknowledged after the archive was written
    client = redis_client.Redis.from_url(redis_server.url)
    archived = client.llen(f"{prefix}:{{s}}:archive")
    held = client.xlen(f"{prefix}:{{s}}:log")
    assert archived >= 1 and held <= 2600 - 1000, (archived, held)
    back = await log.read("s")
    trimmed = [r for r in back if isinstance(r.body, OutBody) and r.body.server_event_seq <= 30]
    assert trimmed and all(r.body.trimmed for r in trimmed)
    untrimmed = [
        r for r in records if not (isinstance(r.body, OutBody) and r.body.server_event_seq <= 30)
    ]
    assert [r for r in back if r not in trimmed] == untrimmed
    assert await log.read("s", after_seq=700) == [r for r in back if r.seq > 700]
    assert await log.read("s", after_seq=2450) == records[2450:]
    await log.close()


async def test_deleting_a_session_deletes_its_media_and_no_other(redis_server, prefix, tmp_path):
    media = tmp_path / "media"
    log = _log(redis_server, prefix, media)
    silence = AudioBody(
        pcm=bytes(4800), sample_rate_hz=24000, source_format="pcm16", duration_ms=100
    )
    same = [Record(epoch=0, ts_ms=n, origin="client", body=silence, seq=n) for n in range(1, 1300)]
    same[599] = _snapshot(600)
    same[1199] = _snapshot(1200)  # the first 599 records are archived
    for session_id in ("s", "t"):  # the same bytes in both: still segments of their own
        await log.create(session_id)
        fence = await log.acquire_lease(session_id, "me")
        for at in range(0, len(same), 50):
            await log.append(session_id, same[at : at + 50], fence)
    await log.seal_media()
    files = {p.name for p in media.glob("??/*")}
    await log.delete("s")
    left = {p.name for p in media.glob("??/*")}
    assert left and left < files  # the deleted session's segments and archives are gone
    fresh = _log(redis_server, prefix, media)
    assert await fresh.read("t") == same  # the other session's, untouched
    await fresh.delete("t")
    assert not list(media.glob("??/*"))
    await fresh.close()
    await log.close()


async def test_segments_whose_references_were_trimmed_away_are_deleted_with_the_session(
    redis_server, prefix, tmp_path
):
    """A trim (acknowledged payloads) or a compaction (committed audio) drops
    references; the segments they named are still the session's, and go
    with its delete rather than staying on disk for ever."""
    media = tmp_path / "media"
    log = _log(redis_server, prefix, media)
    fence = await _opened(log)
    # input audio and answers only: a unit's reference would keep naming the segment
    records = [_audio(seq, seq) for seq in range(1, 9)] + [_out(seq, seq) for seq in range(9, 12)]
    await log.append("s", records, fence)
    await log.seal_media()
    assert list(media.glob("??/*"))
    last_event = max(r.body.server_event_seq for r in records if isinstance(r.body, OutBody))
    await log.trim("s", last_event)
    await log.compact_audio("s", records[-1].seq)
    await log.delete("s")
    assert not list(media.glob("??/*"))
    await log.close()
