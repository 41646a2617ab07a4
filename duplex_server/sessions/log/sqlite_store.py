"""SQLite log backend: the embedded durable default.

One writer thread owns the write connection and commits in groups: every
operation queued while the previous transaction was committing goes into the
next one, and one fsync covers them all. There are no savepoints: an
operation checks everything it can refuse (fence, sequence, event ids) before
it writes, so a refused append leaves nothing behind and its neighbours still
commit; a failure of SQLite itself fails the whole group. The event loop never
touches the disk; it awaits futures that the writer resolves after COMMIT
returns.
Reads run on a separate thread with their own connection (WAL lets readers
proceed while the writer commits).

Durability: ``fsync-per-batch`` (``synchronous=FULL``: an append is
acknowledged only after its transaction is on disk) or ``os-buffered``
(``synchronous=OFF``: acknowledged once handed to the OS, which survives a
process crash but not a power loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import msgspec

from duplex_server.sessions.core.records import AudioBody, ItemBody, Record
from duplex_server.sessions.log import sqlite_media
from duplex_server.sessions.log.media import (
    MediaSealer,
    OrphanSweep,
    SegmentBlobs,
    SegmentReader,
)
from duplex_server.sessions.log.record_codec import (
    decode_records,
    encode_records,
    record_decoder,
    record_encoder,
)
from duplex_server.sessions.log.store import (
    DuplicateEvent,
    LocalLeases,
    LogError,
    SequenceConflict,
    SessionRow,
    StaleFence,
    StorageUnavailable,
    UnknownSession,
)

Durability = Literal["fsync-per-batch", "os-buffered"]
GROUP_MAX = 512  # operations per transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    fence INTEGER NOT NULL DEFAULT 0,
    owner TEXT NOT NULL DEFAULT '',
    last_seq INTEGER NOT NULL DEFAULT 0,
    trimmed_upto INTEGER NOT NULL DEFAULT 0,
    closed INTEGER NOT NULL DEFAULT 0,
    last_ts_ms INTEGER NOT NULL DEFAULT 0
);
-- A rowid table: rows carry kilobytes of audio, which WITHOUT ROWID stores badly.
CREATE TABLE IF NOT EXISTS records (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    event_id TEXT,
    server_event_seq INTEGER,
    record BLOB NOT NULL,
    payload BLOB,
    twin INTEGER NOT NULL DEFAULT 0,
    UNIQUE (session_id, seq)
);
CREATE INDEX IF NOT EXISTS records_event_id
    ON records (session_id, event_id) WHERE event_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS records_snapshot
    ON records (session_id, seq) WHERE kind = 'snapshot';
CREATE INDEX IF NOT EXISTS records_out
    ON records (session_id, server_event_seq) WHERE server_event_seq IS NOT NULL;
"""


_INSERT_RECORD = (
    "INSERT INTO records (session_id, seq, kind, event_id, record, payload, "
    "server_event_seq, twin, audio, sealed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class StoreError(Exception):
    """The database cannot be used at all (corrupt, not a database, unreadable)."""


def _select_records(
    conn: sqlite3.Connection,
    session_id: str,
    after_seq: int = 0,
    segments: SegmentReader | None = None,
    unsealed: dict[str, bytes] | None = None,
    bulk_columns: str = sqlite_media.BULK_COLUMNS,
) -> list[Record]:
    """The session's records after ``after_seq``, their sealed bulk read
    back from ``segments``; what is not sealed yet goes into ``unsealed``
    where given (for the sealer to adopt). Blocking."""
    # The rows and their pending values in one snapshot: a seal committed
    # between two reads would move a value out of media_pending unseen.
    began = not conn.in_transaction
    if began:
        conn.execute("BEGIN")
    try:
        # One row more than asked: a twin at the start needs the GA event before it.
        rows = conn.execute(
            f"SELECT seq, record, payload, twin, {bulk_columns} FROM records "
            "WHERE session_id = ? AND seq >= ? ORDER BY seq",
            (session_id, max(after_seq, 1)),
        ).fetchall()
        pending = (
            sqlite_media.pending_values(conn, session_id, rows[0][0])
            if any(row[5] & sqlite_media.PENDING for row in rows)
            else {}
        )
    finally:
        if began:
            conn.execute("COMMIT")
    if (
        not rows
        and conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        is None
    ):
        raise UnknownSession(session_id)
    stored = []
    for seq, blob, payload, twin, audio, sealed in rows:
        if sealed & sqlite_media.PENDING:
            payload, audio = sqlite_media.with_pending(
                session_id, seq, payload, audio, sealed, pending
            )
        if unsealed is not None:
            unsealed.update(sqlite_media.unsealed_values(seq, payload, audio, sealed))
        if sealed:
            payload, audio = sqlite_media.resolved(
                session_id, seq, payload, audio, sealed, segments
            )
        stored.append((record_decoder.decode(blob), payload, bool(twin), audio))
    records = decode_records(session_id, stored)
    return [r for r in records if r.seq > after_seq]


def _connect(path: Path, durability: Durability) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'fsync-per-batch' else 'OFF'}")
    return conn


def check_database(path: Path) -> None:
    """Refuse a corrupt or foreign file with its path and a plain reason."""
    if not path.exists():
        return
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            result = conn.execute("PRAGMA quick_check").fetchone()
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: not a usable session database ({exc})") from None
    if result is None or result[0] != "ok":
        raise StoreError(f"{path}: database is corrupt ({result[0] if result else 'no result'})")
    if tables and "records" not in tables:
        raise StoreError(f"{path}: this SQLite file is not a duplex-server session store")


# Heads of the sessions written most recently, kept by the writer (_Heads).
MAX_CACHED_HEADS = 10_000


class _Heads:
    """Each session's (fence, last_seq) as the writer knows it.

    The writer thread is the database's only writer, so it can answer the
    fence and sequence checks from memory; changes made inside a group become
    visible to later operations of the same group at once and to everyone
    once the group commits, and vanish if it does not.

    The committed heads are a cache of the ``sessions`` table (each one is
    written there in the same transaction), so only the ``max_cached`` most
    recently written are kept: a server that has served a million sessions
    does not remember a million heads; a session not written for long is
    read back from its row.
    """

    def __init__(self, max_cached: int = MAX_CACHED_HEADS) -> None:
        self._committed: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._pending: dict[str, tuple[int, int] | None] = {}
        self._max_cached = max_cached

    def get(self, conn: sqlite3.Connection, session_id: str) -> tuple[int, int] | None:
        if session_id in self._pending:
            return self._pending[session_id]
        head = self._committed.get(session_id)
        if head is None:
            row = conn.execute(
                "SELECT fence, last_seq FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
            head = (row[0], row[1]) if row else None
        return head

    def set(self, session_id: str, head: tuple[int, int] | None) -> None:
        self._pending[session_id] = head

    def commit(self) -> None:
        for session_id, head in self._pending.items():
            if head is None:
                self._committed.pop(session_id, None)
            else:
                self._committed[session_id] = head
                self._committed.move_to_end(session_id)
        self._pending.clear()
        while len(self._committed) > self._max_cached:
            self._committed.popitem(last=False)

    def __len__(self) -> int:
        return len(self._committed)

    def rollback(self) -> None:
        self._pending.clear()


class _Op:
    __slots__ = ("fn", "future", "loop")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], loop, future) -> None:
        self.fn = fn
        self.loop = loop
        self.future = future


class SqliteLog(LocalLeases):
    """With ``media_dir`` (or a media location the database recorded), each
    session's bulk is sealed out into segments (``sqlite_media``), opened
    with ``open_media``."""

    durable = True

    def __init__(
        self,
        path: str | Path,
        durability: Durability = "fsync-per-batch",
        *,
        max_cached_heads: int = MAX_CACHED_HEADS,
        media_dir: str | None = None,
        open_media: Callable[[str], SegmentBlobs] | None = None,
    ) -> None:
        self.path = Path(path)
        self.durability = durability
        check_database(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write = _connect(self.path, durability)
            self._write.executescript(_SCHEMA)
            columns = {row[1] for row in self._write.execute("PRAGMA table_info(records)")}
            if "twin" not in columns:  # a store created before twins were folded
                self._write.execute(
                    "ALTER TABLE records ADD COLUMN twin INTEGER NOT NULL DEFAULT 0"
                )
            sqlite_media.migrate(self._write)
            self.media_location = sqlite_media.media_location(self._write, media_dir)
            self._read = _connect(self.path, durability)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: cannot open session database ({exc})") from None
        except sqlite_media.MediaElsewhere as exc:
            raise StoreError(f"{self.path}: {exc}") from None
        self._media: SegmentBlobs | None = None
        if self.media_location is not None:
            if open_media is None:
                raise StoreError(f"{self.path}: its media is in {self.media_location}; open it")
            self._media = open_media(self.media_location)
        self._sealer = MediaSealer(self._media, self) if self._media is not None else None
        self._segments = SegmentReader(self._media) if self._media is not None else None
        self._sweep = (
            OrphanSweep(self._media, self.media_listed) if self._media is not None else None
        )
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_loop, name="sqlite-writer", daemon=True)
        self._writer.start()
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-reader")
        self._heads = _Heads(max_cached_heads)
        self._compacted: dict[str, int] = {}  # writer thread only
        self._after_commit: list[Callable[[], None]] = []  # writer thread only

    # --- writer thread -------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            while len(group) < GROUP_MAX:
                try:
                    op = self._queue.get_nowait()
                except queue.Empty:
                    break
                if op is None:
                    self._queue.put(None)
                    break
                group.append(op)
            self._commit_group(group)

    def _commit_group(self, group: list[_Op]) -> None:
        """One transaction for the whole group.

        Operations check everything they can refuse (fence, sequence, event
        ids) before they write, so a refused operation leaves nothing behind
        and needs no savepoint; a failure of SQLite itself fails the group.
        """
        conn = self._write
        outcomes: list[tuple[bool, Any]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op in group:
                try:
                    outcomes.append((True, op.fn(conn)))
                except LogError as exc:
                    outcomes.append((False, exc))
            conn.execute("COMMIT")
            self._heads.commit()
            for done in self._after_commit:
                done()
        except (sqlite3.Error, OSError) as exc:
            self._heads.rollback()
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            failure = StorageUnavailable(f"{self.path}: {exc}")
            outcomes = [(False, failure)] * len(group)
        finally:
            self._after_commit.clear()
        for op, (ok, value) in zip(group, outcomes, strict=True):
            op.loop.call_soon_threadsafe(_resolve, op.future, ok, value)

    async def _submit(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put(_Op(fn, loop, future))
        return await future

    async def _query(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, fn, self._read)

    # --- the log interface -----------------------------------------------------

    async def create(self, session_id: str) -> None:
        await self._submit(
            lambda c: c.execute(
                "INSERT OR IGNORE INTO sessions (session_id) VALUES (?)", (session_id,)
            )
        )

    async def acquire_lease(
        self,
        session_id: str,
        owner: str,
        *,
        expect_fence: int | None = None,
        handoff: bool = False,
    ) -> int:
        def take(conn: sqlite3.Connection) -> int:
            head = self._heads.get(conn, session_id)
            if head is None:
                raise UnknownSession(session_id)
            if expect_fence is not None and expect_fence != head[0]:
                raise StaleFence(f"fence moved from {expect_fence} to {head[0]}")
            conn.execute(
                "UPDATE sessions SET fence = ?, owner = ? WHERE session_id = ?",
                (head[0] + 1, owner, session_id),
            )
            self._heads.set(session_id, (head[0] + 1, head[1]))
            return head[0] + 1

        return await self._submit(take)

    async def append(self, session_id: str, records: list[Record], fence: int) -> list[int]:
        rows = encode_records(records, split_audio=self._sealer is not None)
        closes = any(r.kind == "close" for r in records)
        last_ts = records[-1].ts_ms if records else 0
        seqs = await self._submit(
            lambda c: self._append(c, session_id, rows, fence, closes, last_ts)
        )
        if self._sealer is not None:
            bulk: dict[str, bytes] = {}
            for row in rows:
                bulk.update(sqlite_media.bulk_values(row.seq, row.payload, row.audio))
            self._sealer.appended(session_id, bulk)
        return seqs

    def _append(self, conn, session_id, rows, fence, closes, last_ts) -> list[int]:
        head = self._heads.get(conn, session_id)
        if head is None:
            raise UnknownSession(session_id)
        current_fence, last_seq = head
        if fence < current_fence:
            raise StaleFence(f"fence {fence} < current {current_fence} for {session_id}")
        seqs = [row[0] for row in rows]
        if seqs != list(range(last_seq + 1, last_seq + 1 + len(rows))):
            raise SequenceConflict(f"{session_id}: batch {seqs[:3]} does not follow {last_seq}")
        for _seq, _kind, event_id, *_ in rows:
            if event_id is not None and (
                landed := conn.execute(
                    "SELECT seq FROM records WHERE session_id = ? AND event_id = ?",
                    (session_id, event_id),
                ).fetchone()
            ):
                raise DuplicateEvent(event_id, landed[0])
        if self._sealer is None:
            conn.executemany(_INSERT_RECORD, [(session_id, *row, 0) for row in rows])
        else:
            held, pending = sqlite_media.held_apart(session_id, rows)
            conn.executemany(_INSERT_RECORD, held)
            conn.executemany(sqlite_media.INSERT_PENDING, pending)
        conn.execute(
            "UPDATE sessions SET last_seq = ?, last_ts_ms = ?, closed = closed OR ? "
            "WHERE session_id = ?",
            (seqs[-1] if seqs else last_seq, last_ts, int(closes), session_id),
        )
        self._heads.set(session_id, (current_fence, seqs[-1] if seqs else last_seq))
        return seqs

    async def read(self, session_id: str, after_seq: int = 0) -> list[Record]:
        if self._sealer is None:
            return await self._query(lambda conn: _select_records(conn, session_id, after_seq))
        unsealed: dict[str, bytes] = {}
        records = await self._query(
            lambda conn: _select_records(conn, session_id, after_seq, self._segments, unsealed)
        )
        self._sealer.adopt(session_id, unsealed)  # a crash came before these were sealed
        return records

    # --- media sealed out (with a media folder) ----------------------------------

    async def swap_bulk(self, session_id: str, refs: dict[str, bytes]) -> int:
        """A segment holds these bulk values now: the rows keep references."""
        return await self._submit(lambda conn: sqlite_media.swap(conn, session_id, refs))

    async def archive_old(self, session_id: str) -> None:
        """Nothing: old rows stay on disk, only their bulk leaves (Redis moves
        old records out of memory; SQLite's are not in memory)."""

    async def seal_media(self) -> None:
        """Seal every session's waiting bulk now, however little (shutdown, tests)."""
        if self._sealer is not None:
            await self._sealer.drain()

    async def expire_media(self, session_id: str) -> None:
        """``--media-retention-s``: the session's media goes, its records stay."""
        if self._media is None:
            return
        media = self._media
        if self._sealer is not None:
            self._sealer.forget(session_id)  # what waits to be sealed goes with it
        doomed = await self._submit(lambda conn: sqlite_media.expire(conn, session_id))
        await asyncio.to_thread(media.delete_sync, doomed)

    async def media_listed(self, session_id: str) -> set[str]:
        """Every segment sealed for the session (none once it is deleted):
        what the orphan sweep keeps."""
        return await self._query(lambda conn: sqlite_media.segment_digests(conn, session_id))

    async def sweep_media(self, now_s: float) -> int:
        """Delete media segments that no session lists (a crash or a full
        disk between a segment's write and its listing), some at a time
        (``media.sweep_orphans``); nothing without a media folder."""
        return 0 if self._sweep is None else await self._sweep.run(now_s)

    async def latest_snapshot(self, session_id: str) -> int:
        def fetch(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT MAX(seq) FROM records WHERE session_id = ? AND kind = 'snapshot'",
                (session_id,),
            ).fetchone()
            return int(row[0] or 0)

        return await self._query(fetch)

    async def read_open_sessions(self) -> dict[str, list[Record]]:
        """Every open session's records in one pass (what recovery needs)."""

        def fetch(conn: sqlite3.Connection) -> dict[str, list[Record]]:
            # One primary-key range read per session: a JOIN ordered across
            # sessions made SQLite sort every blob (3x slower, bench recovery).
            open_ids = [
                r[0]
                for r in conn.execute(
                    "SELECT session_id FROM sessions WHERE closed = 0 ORDER BY rowid"
                )
            ]
            return {sid: _select_records(conn, sid, 0, self._segments) for sid in open_ids}

        return await self._query(fetch)

    async def trim(self, session_id: str, upto_server_event_seq: int) -> int:
        def trim(conn: sqlite3.Connection) -> int:
            (done,) = conn.execute(
                "SELECT trimmed_upto FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone() or (0,)
            if upto_server_event_seq <= done:
                return 0
            cursor = conn.execute(
                "UPDATE records SET payload = NULL, sealed = sealed & ~1 WHERE session_id = ? "
                "AND server_event_seq > ? AND server_event_seq <= ? AND payload IS NOT NULL",
                (session_id, done, upto_server_event_seq),
            )
            conn.execute(
                "UPDATE sessions SET trimmed_upto = max(trimmed_upto, ?) WHERE session_id = ?",
                (upto_server_event_seq, session_id),
            )
            return cursor.rowcount

        return await self._submit(trim)

    async def compact_audio(self, session_id: str, upto_seq: int) -> int:
        """Drop the samples of audio records (and created items) up to ``upto_seq``;
        their metadata stays, and so does the folded state."""

        def compact(conn: sqlite3.Connection) -> int:
            # Forward only: what an earlier compaction covered is not read again
            # (the mark lives in the writer thread; after a restart it starts at 0).
            start = self._compacted.get(session_id, 0)
            # The mark moves only if this group commits: a failed compaction
            # is redone by the next one.
            self._after_commit.append(
                lambda: self._compacted.__setitem__(session_id, max(start, upto_seq))
            )
            # audio kept apart (with a media folder): the value or its reference goes
            changed = conn.execute(
                "UPDATE records SET audio = NULL, sealed = sealed & ~2 WHERE session_id = ? "
                "AND seq > ? AND seq <= ? AND kind IN ('audio', 'item') AND audio IS NOT NULL",
                (session_id, start, upto_seq),
            ).rowcount
            rows = conn.execute(
                "SELECT seq, record FROM records WHERE session_id = ? AND seq > ? AND seq <= ? "
                "AND kind IN ('audio', 'item')",
                (session_id, start, upto_seq),
            ).fetchall()
            for seq, blob in rows:
                record = record_decoder.decode(blob)
                body = record.body
                if isinstance(body, AudioBody) and body.pcm:
                    record.body = msgspec.structs.replace(body, pcm=b"")
                elif isinstance(body, ItemBody) and any(body.audio):
                    record.body = msgspec.structs.replace(body, audio=[b"" for _ in body.audio])
                else:
                    continue
                conn.execute(
                    "UPDATE records SET record = ? WHERE session_id = ? AND seq = ?",
                    (record_encoder.encode(record), session_id, seq),
                )
                changed += 1
            return changed

        return await self._submit(compact)

    async def delete(self, session_id: str) -> None:
        """With media: its segments first, then its rows (a crash between
        leaves references in a session the next purge deletes again, never
        files that no row lists)."""
        if self._media is not None:
            media = self._media
            if self._sealer is not None:
                self._sealer.forget(session_id)
            named = await self._submit(lambda conn: sqlite_media.segment_digests(conn, session_id))
            await asyncio.to_thread(media.delete_sync, named)

        def delete(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM records WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM media_segments WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            self._heads.set(session_id, None)

        await self._submit(delete)

    async def sessions(self, *, open_only: bool = False) -> list[SessionRow]:
        def fetch(conn: sqlite3.Connection) -> list[SessionRow]:
            sql = (
                "SELECT session_id, fence, owner, last_seq, trimmed_upto, closed, last_ts_ms, "
                "media_expired FROM sessions"
            )
            if open_only:
                sql += " WHERE closed = 0"
            return [
                SessionRow(sid, fence, owner, last, trimmed, bool(closed), ts, bool(expired))
                for sid, fence, owner, last, trimmed, closed, ts, expired in conn.execute(
                    sql + " ORDER BY rowid"
                )
            ]

        return await self._query(fetch)

    async def close(self) -> None:
        await self.seal_media()
        self._queue.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._writer.join)
        self._reader.shutdown(wait=True)
        self._write.close()
        self._read.close()


def _resolve(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class SqliteReader:
    """Synchronous, read-only access for the audit tools (inspect, replay)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise StoreError(f"{self.path}: no such session database")
        check_database(self.path)
        # As a URI, so read-only; as_uri() escapes what a URI would misread ('#', '?').
        self._conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        self.media_location = sqlite_media.recorded_location(self._conn)
        self._segments: SegmentReader | None = None
        self._bulk_columns = sqlite_media.bulk_columns(self._conn)  # read-only: not migrated

    def open_media(self, media: SegmentBlobs) -> None:
        """Read sealed bulk from ``media`` (the database's :attr:`media_location`)."""
        self._segments = SegmentReader(media)

    def sessions(self) -> list[SessionRow]:
        rows = self._conn.execute(
            "SELECT session_id, fence, owner, last_seq, trimmed_upto, closed, last_ts_ms "
            "FROM sessions ORDER BY rowid"
        )
        return [SessionRow(sid, f, o, last, t, bool(c), ts) for sid, f, o, last, t, c, ts in rows]

    def records(self, session_id: str) -> list[Record]:
        return _select_records(
            self._conn, session_id, segments=self._segments, bulk_columns=self._bulk_columns
        )

    def close(self) -> None:
        self._conn.close()
