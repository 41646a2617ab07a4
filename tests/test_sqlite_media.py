"""Audio out of the SQLite file (issue 41, sessions/log/sqlite_media.py):
with a media folder, a SQLite session's bulk (input audio, a native model's
units, event payloads) moves into segment files and its rows keep
references; every read gives back the records as they were appended; the
database remembers where its media is; a missing or corrupt segment is
reported, never replaced; a crash before the swap loses nothing."""

from __future__ import annotations

import sqlite3

import pytest

from duplex_server.app import open_media
from duplex_server.sessions.core.records import AudioBody, OutBody, UnitBody
from duplex_server.sessions.log.media import MediaUnavailable
from duplex_server.sessions.log.sqlite_store import SqliteLog, SqliteReader, StoreError
from tests.test_media_segments import _bulk_of, _conversation, retention_checked


def _log(tmp_path, media: str | None = "media", cls: type[SqliteLog] = SqliteLog) -> SqliteLog:
    given = str(tmp_path / media) if media is not None else None
    return cls(tmp_path / "s.db", media_dir=given, open_media=open_media)


def _stored_bulk(tmp_path) -> tuple[int, int, int]:
    """(bytes of payload and audio in the database: in the rows and waiting
    in media_pending; rows sealed; rows with bulk)."""
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        in_rows, sealed, with_bulk = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(payload)), 0) + COALESCE(SUM(LENGTH(audio)), 0), "
            "SUM(sealed & 3 != 0), SUM(payload IS NOT NULL OR audio IS NOT NULL) FROM records"
        ).fetchone()
        (waiting,) = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(value)), 0) FROM media_pending"
        ).fetchone()
        return in_rows + waiting, sealed, with_bulk
    finally:
        conn.close()


async def _opened(log: SqliteLog, session_id: str = "s") -> int:
    await log.create(session_id)
    return await log.acquire_lease(session_id, "me")


async def test_sealed_bulk_leaves_references_and_reads_back_whole(tmp_path):
    log = _log(tmp_path)
    fence = await _opened(log)
    records = _conversation()
    for at in range(0, len(records), 4):  # batches, as a session appends them
        await log.append("s", records[at : at + 4], fence)
    await log.seal_media()
    held, sealed, with_bulk = _stored_bulk(tmp_path)
    assert sealed == with_bulk > 100, (sealed, with_bulk)
    whole = sum(len(_bulk_of(r.body)) for r in records)
    assert held * 20 < whole, (held, whole)  # about 45 bytes a reference, not kilobytes
    assert await log.read("s") == records
    assert await log.read("s", after_seq=30) == records[30:]
    assert await log.read_open_sessions() == {"s": records}  # what recovery reads
    await log.close()
    # a restart with no --media-dir finds the media where the database says
    again = _log(tmp_path, media=None)
    assert again.media_location == str((tmp_path / "media").resolve())
    assert await again.read("s") == records
    await again.close()
    # and so do the audit tools, which open it read-only
    reader = SqliteReader(tmp_path / "s.db")
    assert reader.media_location is not None
    reader.open_media(open_media(reader.media_location))
    assert reader.records("s") == records
    reader.close()


async def test_another_media_folder_is_refused_at_open(tmp_path):
    log = _log(tmp_path)
    await log.close()
    with pytest.raises(StoreError, match="this database's media is in"):
        _log(tmp_path, media="elsewhere")


async def test_retention_drops_sealed_values_as_it_drops_whole_ones(tmp_path):
    log = _log(tmp_path)
    await retention_checked(log, await _opened(log))
    await log.close()


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
async def test_a_damaged_segment_is_reported_by_name(tmp_path, damage):
    log = _log(tmp_path)
    fence = await _opened(log)
    await log.append("s", _conversation(turns=2), fence)
    await log.close()  # sealed at close
    [segment] = [p for p in (tmp_path / "media").rglob("*") if p.is_file()]
    if damage == "missing":
        segment.unlink()
    else:
        segment.write_bytes(b"x" + segment.read_bytes()[1:])
    fresh = _log(tmp_path)  # nothing cached
    with pytest.raises(MediaUnavailable, match=segment.name[:12]):
        await fresh.read("s")
    await fresh.close()


class _CrashBeforeSwap(SqliteLog):
    """A process killed after writing a segment, before its rows named it."""

    async def swap_bulk(self, session_id: str, refs: dict[str, bytes]) -> int:
        raise OSError("killed")


async def test_a_crash_between_segment_and_swap_loses_nothing(tmp_path):
    crashed = _log(tmp_path, cls=_CrashBeforeSwap)
    fence = await _opened(crashed)
    records = _conversation(turns=2)
    await crashed.append("s", records, fence)
    await crashed.close()
    assert _stored_bulk(tmp_path)[1] == 0  # nothing sealed: the bulk stayed in the rows
    after = _log(tmp_path)
    assert await after.read("s") == records  # read whole, and adopted for sealing
    await after.seal_media()
    _, sealed, with_bulk = _stored_bulk(tmp_path)
    assert sealed == with_bulk > 0
    assert await after.read("s") == records
    await after.close()


async def test_deleting_a_session_deletes_its_media_and_no_other(tmp_path):
    log = _log(tmp_path)
    for session_id in ("s", "t"):
        fence = await _opened(log, session_id)
        await log.append(session_id, _conversation(turns=2), fence)
    await log.seal_media()
    before = {p.name for p in (tmp_path / "media").rglob("*") if p.is_file()}
    assert len(before) == 2  # one segment each: a session's header makes it its own
    await log.delete("s")
    left = {p.name for p in (tmp_path / "media").rglob("*") if p.is_file()}
    assert len(left) == 1 and left < before
    assert await log.read("t") == _conversation(turns=2)
    await log.close()


async def test_expired_media_goes_and_the_records_stay(tmp_path):
    log = _log(tmp_path)
    fence = await _opened(log)
    records = _conversation(turns=2)
    await log.append("s", records, fence)
    await log.seal_media()  # sealed out, so expiring deletes files
    await log.expire_media("s")
    assert not [p for p in (tmp_path / "media").rglob("*") if p.is_file()]
    back = await log.read("s")
    assert [r.seq for r in back] == [r.seq for r in records]
    assert all(b.trimmed for b in (r.body for r in back) if isinstance(b, OutBody))
    assert not any(r.body.pcm for r in back if isinstance(r.body, (AudioBody, UnitBody)))
    [row] = await log.sessions()
    assert row.media_expired
    await log.close()


async def test_the_file_does_not_keep_the_room_of_sealed_audio(tmp_path):
    """Rows written with kilobytes and shrunk to references would leave
    their pages almost empty for good; values wait apart, so the file holds
    the records, not the audio that passed through it."""
    log = _log(tmp_path)
    fence = await _opened(log)
    whole, seq = 0, 1
    for _ in range(30):
        records = _conversation(first=seq)
        for at in range(0, len(records), 4):
            await log.append("s", records[at : at + 4], fence)
        await log.seal_media()  # as the sealer does every few seconds
        whole += sum(len(_bulk_of(r.body)) for r in records)
        seq = records[-1].seq + 1
    await log.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (free,) = conn.execute("PRAGMA freelist_count").fetchone()
        (waiting,) = conn.execute("SELECT COUNT(*) FROM media_pending").fetchone()
    finally:
        conn.close()
    assert waiting == 0  # every value sealed left media_pending
    used = (pages - free) * page_size
    assert used * 4 < whole, (used, whole)
