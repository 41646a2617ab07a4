"""Orphan media (issue 41, ``media.sweep_orphans``): a crash or an outage
between a segment's write and its listing leaves a file nothing lists, which
no delete and no retention would ever remove. The sweep deletes such a
blob once it is older than the grace, its header names a session, and that
session (or none, once deleted) does not list it; everything else stays.
Against real stores: SQLite on a file, the session-wide redis-server, an
S3 server (moto's), each with a real media folder or bucket."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from duplex_server.app import create_app, open_media, open_store
from duplex_server.config import ServerConfig
from duplex_server.jobs.blobs import BlobStore
from duplex_server.jobs.s3_blobs import S3Blobs
from duplex_server.sessions.log import redis_archive
from duplex_server.sessions.log.media import (
    ORPHAN_GRACE_S,
    SEGMENT_TYPE,
    _segment_of,
    sweep_orphans,
)
from duplex_server.sessions.log.redis_store import RedisLog
from duplex_server.sessions.log.sqlite_store import SqliteLog
from duplex_server.sessions.log.store import StorageUnavailable
from tests.test_media_segments import _conversation, _snapshot
from tests.test_s3_media import BUCKET, s3_env, s3_server

HOUR_S = 3600.0


class _SqliteCrashBeforeSwap(SqliteLog):
    """A process killed after writing a segment, before its rows named it."""

    async def swap_bulk(self, session_id: str, refs: dict[str, bytes]) -> int:
        raise OSError("killed")


class _RedisCrashBeforeSwap(RedisLog):
    """A process killed after writing a segment, before Redis listed it."""

    async def swap_bulk(self, session_id: str, refs: dict[str, bytes]) -> int:
        raise StorageUnavailable("killed")


def _sqlite(tmp_path: Path, cls: type[SqliteLog] = SqliteLog) -> SqliteLog:
    return cls(tmp_path / "s.db", media_dir=str(tmp_path / "media"), open_media=open_media)


def _files(media: Path) -> set[str]:
    return {p.name for p in media.glob("??/*") if p.is_file()}


def _age(media: Path, seconds: float) -> None:
    """Every blob in the folder last written ``seconds`` ago."""
    then = time.time() - seconds
    for path in media.glob("??/*"):
        os.utime(path, (then, then))


async def _appended(log: SqliteLog | RedisLog, session_id: str, turns: int = 1) -> list:
    await log.create(session_id)
    fence = await log.acquire_lease(session_id, "me")
    records = _conversation(turns=turns)
    await log.append(session_id, records, fence)
    await log.seal_media()
    return records


async def _orphaned_sqlite(tmp_path: Path, session_id: str) -> set[str]:
    """The segments a crash before the swap left for ``session_id``."""
    media = tmp_path / "media"
    before = _files(media) if media.exists() else set()
    crashed = _sqlite(tmp_path, _SqliteCrashBeforeSwap)
    await _appended(crashed, session_id)
    await crashed.close()
    orphans = _files(media) - before
    assert orphans  # written, and listed nowhere
    return orphans


# --- SQLite ----------------------------------------------------------------------


async def test_an_old_orphan_goes_and_a_listed_segment_stays(tmp_path):
    media = tmp_path / "media"
    orphans = await _orphaned_sqlite(tmp_path, "s")
    log = _sqlite(tmp_path)
    kept = await _appended(log, "t")
    listed = _files(media) - orphans
    assert listed
    _age(media, 2 * HOUR_S)
    assert await log.sweep_media(time.time()) == len(orphans)
    assert _files(media) == listed
    assert await log.read("t") == kept  # the live session's audio, whole
    # and the crashed session's bulk never left its rows: read whole, sealed again
    assert await log.read("s") == _conversation(turns=1)
    await log.close()


async def test_a_young_orphan_stays_until_it_is_past_the_grace(tmp_path):
    media = tmp_path / "media"
    orphans = await _orphaned_sqlite(tmp_path, "s")
    log = _sqlite(tmp_path)
    now = time.time()  # the files were written just now
    assert await log.sweep_media(now + ORPHAN_GRACE_S - 60) == 0
    assert _files(media) == orphans
    assert await log.sweep_media(now + ORPHAN_GRACE_S + 60) == len(orphans)
    assert not _files(media)
    await log.close()


async def test_what_is_not_a_segment_stays(tmp_path):
    media = tmp_path / "media"
    log = _sqlite(tmp_path)
    blobs = BlobStore(media)
    job = blobs.put_sync(b"RIFF a job's result, any bytes at all", "audio/wav")
    short = blobs.put_sync(b"duplex-media-segment 1 s", SEGMENT_TYPE)  # no end to its header
    (media / job.digest[:2] / "notes.txt").write_text("not a blob's name")
    _age(media, 2 * HOUR_S)
    assert await log.sweep_media(time.time()) == 0
    assert {job.digest, short.digest, "notes.txt"} <= _files(media)
    await log.close()


async def test_the_orphans_of_a_deleted_session_go(tmp_path):
    media = tmp_path / "media"
    orphans = await _orphaned_sqlite(tmp_path, "s")
    log = _sqlite(tmp_path)
    await log.delete("s")
    assert _files(media) == orphans  # what the delete could not find: the gap
    _age(media, 2 * HOUR_S)
    assert await log.sweep_media(time.time()) == len(orphans)
    assert not _files(media)
    await log.close()


async def test_a_pass_examines_a_bounded_number_and_the_next_goes_on(tmp_path):
    media = tmp_path / "media"
    blobs = BlobStore(media)
    for n in range(5):  # segments of a session no store has
        blobs.put_sync(_segment_of("gone", {"a1": b"%d" % n * 100})[0], SEGMENT_TYPE)
    _age(media, 2 * HOUR_S)
    log = _sqlite(tmp_path)
    asked: list[str] = []

    async def listed(session_id: str) -> set[str]:
        asked.append(session_id)
        return await log.media_listed(session_id)

    now, after, deleted = time.time(), "", []
    for _ in range(3):
        swept = await sweep_orphans(blobs, listed, now, after=after, examined=2)
        assert len(swept.deleted) <= 2
        deleted += swept.deleted
        after = swept.resume_after
    assert len(deleted) == 5 and not _files(media)
    assert after == ""  # the folder's end: the next pass starts over
    assert asked == ["gone"] * 3  # one question a session a pass, not one a file
    await log.close()


async def test_an_orphan_written_again_before_its_delete_stays(tmp_path):
    """A session sealed again after its crash writes the same bytes: the
    same name. Found old by the sweep's listing, then put again before the
    delete, it stays (the swap that follows names a file that is there)."""
    media = tmp_path / "media"
    blobs = BlobStore(media)
    segment = _segment_of("s", {"a1": b"samples" * 100})[0]
    ref = blobs.put_sync(segment, SEGMENT_TYPE)
    _age(media, 2 * HOUR_S)
    [(digest, written)] = list(blobs.digests())
    horizon = time.time() - HOUR_S
    assert digest == ref.digest and written < horizon  # an orphan, as the sweep sees it
    blobs.put_sync(segment, SEGMENT_TYPE)  # the seal again, before the delete
    assert blobs.delete_older_sync({digest}, horizon) == []
    assert blobs.read_sync(ref) == segment
    assert not list((media / "tmp").iterdir())  # put back, nothing left aside
    _age(media, 2 * HOUR_S)
    assert blobs.delete_older_sync({digest}, horizon) == [digest]
    assert not _files(media)


async def test_the_sweep_runs_from_the_managers_housekeeping(tmp_path):
    media = tmp_path / "media"
    orphans = await _orphaned_sqlite(tmp_path, "s")
    app = create_app(
        ServerConfig(store=f"sqlite:{tmp_path / 's.db'}", media_dir=str(media), model="echo")
    )
    manager, log = app.state.manager, app.state.log
    now_ms = int(time.time() * 1000)
    await manager._housekeeping(now_ms)
    assert _files(media) == orphans  # within the grace
    await manager._housekeeping(now_ms + int(2 * HOUR_S * 1000))
    assert not _files(media) & orphans
    await log.close()


async def test_a_media_folder_that_fails_skips_the_housekeeping_pass(tmp_path, caplog):
    media = tmp_path / "media"
    app = create_app(
        ServerConfig(store=f"sqlite:{tmp_path / 's.db'}", media_dir=str(media), model="echo")
    )
    shutil.rmtree(media)  # a mount gone: the sweep cannot list it
    await app.state.manager._housekeeping(int(time.time() * 1000))
    assert any(
        "housekeeping skipped" in r.message and "media sweep" in r.message for r in caplog.records
    )
    await app.state.log.close()


# --- Redis -----------------------------------------------------------------------


@pytest.fixture
def prefix() -> str:
    return f"w{uuid.uuid4().hex[:10]}"


def _redis(redis_server, prefix: str, media, cls: type[RedisLog] = RedisLog) -> RedisLog:
    blobs = media if isinstance(media, S3Blobs) else BlobStore(media)
    return cls(redis_server.url, prefix=prefix, media=blobs)


async def test_redis_orphans_go_and_listed_segments_and_archives_stay(
    redis_server, prefix, tmp_path
):
    media = tmp_path / "media"
    crashed = _redis(redis_server, prefix, media, _RedisCrashBeforeSwap)
    await _appended(crashed, "s")
    await crashed.close()
    orphans = _files(media)
    assert orphans
    log = _redis(redis_server, prefix, media)
    # a long session: sealed segments and an archive of its old records
    records = _conversation(turns=110)[:1300]
    records[599], records[1199] = _snapshot(600), _snapshot(1200)
    await log.create("t")
    fence = await log.acquire_lease("t", "me")
    for at in range(0, len(records), 50):
        await log.append("t", records[at : at + 50], fence)
    await log.seal_media()
    listed = _files(media) - orphans
    assert redis_archive.ranges(await log._redis.lrange(f"{prefix}:{{t}}:archive", 0, -1))
    # an archive a crash left unlisted, of a session that is gone
    lost = BlobStore(media).put_sync(
        msgspec.msgpack.encode(redis_archive.Archive("gone", [(1, b"r", b"")], {})),
        redis_archive.ARCHIVE_TYPE,
    )
    not_archive = BlobStore(media).put_sync(msgspec.msgpack.encode(["x", 1, 2]), "x/y")
    _age(media, 2 * HOUR_S)
    assert await log.sweep_media(time.time()) == len(orphans) + 1
    assert _files(media) == listed | {not_archive.digest}
    assert lost.digest not in _files(media)
    assert await log.read("t") == records  # archives and segments all there
    assert await log.read("s") == _conversation(turns=1)  # the bulk stayed in Redis
    await log.delete("t")
    await log.delete("s")
    await log.close()


async def test_redis_orphans_of_a_deleted_session_go(redis_server, prefix, tmp_path):
    media = tmp_path / "media"
    crashed = _redis(redis_server, prefix, media, _RedisCrashBeforeSwap)
    await _appended(crashed, "s")
    await crashed.close()
    orphans = _files(media)
    log = _redis(redis_server, prefix, media)
    await log.delete("s")
    assert _files(media) == orphans
    assert await log.sweep_media(time.time()) == 0  # within the grace
    _age(media, 2 * HOUR_S)
    assert await log.sweep_media(time.time()) == len(orphans)
    assert not _files(media)
    await log.close()


# --- S3 --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_endpoint():
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_location(s3_endpoint, tmp_path, monkeypatch) -> str:
    for name, value in s3_env(s3_endpoint, tmp_path).items():
        monkeypatch.setenv(name, value)
    return f"s3://{BUCKET}/w{uuid.uuid4().hex[:10]}"


async def test_s3_orphans_go_and_the_rest_stays(redis_server, prefix, s3_location):
    blobs = S3Blobs(s3_location)
    log = _redis(redis_server, prefix, blobs)
    await _appended(log, "t")
    listed = {digest for digest, _ in blobs.digests()}
    assert listed
    orphans = {
        blobs.put_sync(_segment_of("gone", {"a1": b"%d" % n * 100})[0], SEGMENT_TYPE).digest
        for n in range(3)
    }
    job = blobs.put_sync(b"a job's result", "audio/wav").digest
    now = time.time()
    assert await log.sweep_media(now) == 0  # just written: within the grace
    assert {digest for digest, _ in blobs.digests()} == listed | orphans | {job}
    assert await log.sweep_media(now + 2 * HOUR_S) == len(orphans)
    assert {digest for digest, _ in blobs.digests()} == listed | {job}
    assert await log.read("t") == _conversation(turns=1)
    await log.delete("t")
    await log.close()


async def test_s3_lists_in_order_from_a_cursor_and_reads_a_header(s3_location):
    blobs = S3Blobs(s3_location)
    data = _segment_of("sess_x", {"a1": bytes(range(256)) * 40})[0]
    ref = blobs.put_sync(data, SEGMENT_TYPE)
    assert blobs.header_sync(ref.digest, 64) == data[:64]  # a ranged read, not the whole
    names = sorted(blobs.put_sync(b"%d" % n, "x/y").digest for n in range(3)) + [ref.digest]
    names.sort()
    assert [d for d, _ in blobs.digests()] == names
    assert [d for d, _ in blobs.digests(after=names[1])] == names[2:]
    assert blobs.delete_older_sync({names[0]}, time.time() - HOUR_S) == []  # written since
    assert blobs.delete_older_sync({names[0]}, time.time() + HOUR_S) == [names[0]]


# --- the job runner's folder is not the media folder -------------------------------


@pytest.mark.parametrize(
    ("media", "blob_dir"),
    [
        ("media", "media"),  # the same folder
        ("s.db.blobs", None),  # the job runner's default beside the database
        ("media", "media/jobs"),  # one inside the other
        ("s3://b/p", "s3://b/p/"),
    ],
)
def test_the_blob_dir_and_the_media_dir_in_one_place_are_refused(tmp_path, media, blob_dir):
    def place(name: str | None) -> str | None:
        if name is None or name.startswith("s3://"):
            return name
        return str(tmp_path / name)

    config = ServerConfig(
        store=f"sqlite:{tmp_path / 's.db'}", media_dir=place(media), blob_dir=place(blob_dir)
    )
    with pytest.raises(ValueError, match="--blob-dir .* and --media-dir"):
        open_store(config)


async def test_apart_they_open(tmp_path):
    config = ServerConfig(
        store=f"sqlite:{tmp_path / 's.db'}",
        media_dir=str(tmp_path / "media"),
        blob_dir=str(tmp_path / "jobs"),
    )
    log = open_store(config)
    await log.close()
