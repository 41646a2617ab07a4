"""SQLite with ``--media-dir``: a session's bulk sealed out of the database.

Without a media folder SQLite keeps audio inside each record's row, as it
always did. With one, a record's audio (input samples, a native model's
units, a created item's audio) and its outbound ``payload`` wait in
``media_pending`` while the row holds a reference's room, and the
:class:`~.media.MediaSealer` moves them into segments a few seconds at a
time, as it does for Redis: once a segment is durable, one transaction
lists it for the session and swaps each value still present for its
reference, marking the row's ``sealed`` bits (a trigger drops the pending
value). A read puts the bytes back; retention drops a value or its
reference alike, and the same triggers drop a pending value with it.

Why the values wait apart: a row written with kilobytes of audio and
shrunk to a 45-byte reference seconds later leaves its leaf page almost
empty, and SQLite fills a rowid table at its end, so that space is never
used again: measured, a compressed one-hour echo call left a 263 MB file
for 308 MB of segments. Rows of ``media_pending`` are written and deleted
in the order they come, so their pages empty whole and are reused.

The database remembers where its media lives (``store_settings``), so the
audit tools and a server started without ``--media-dir`` read it from
there, and a server given another folder is refused rather than left
unable to read what was sealed before.

The functions here run on the store's writer or reader thread.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from duplex_server.sessions.log.media import SegmentReader, decode_ref
from duplex_server.sessions.log.record_codec import StoredRecord
from duplex_server.sessions.log.store import LogError, StorageUnavailable

SEALED_PAYLOAD = 1  # the row's payload is a reference to its segment
SEALED_AUDIO = 2  # the row's audio is a reference to its segment
PENDING_PAYLOAD = 4  # the row's payload waits in media_pending (the row holds its room)
PENDING_AUDIO = 8  # the row's audio waits in media_pending
PENDING = PENDING_PAYLOAD | PENDING_AUDIO
# What a pending value's row holds: room for the reference that replaces it
# (about 45 bytes), so the swap never grows a row and splits its page.
REF_ROOM = bytes(64)
S3_SCHEME = "s3://"

SCHEMA = """
CREATE TABLE IF NOT EXISTS media_segments (
    session_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (session_id, digest)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS store_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
-- A rowid table: its rows are kilobytes, written and deleted in order.
CREATE TABLE IF NOT EXISTS media_pending (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    what TEXT NOT NULL,
    value BLOB NOT NULL,
    UNIQUE (session_id, seq, what)
);
-- A pending value goes when its row's column changes (sealed, trimmed,
-- compacted, expired) or the row does.
CREATE TRIGGER IF NOT EXISTS media_pending_payload AFTER UPDATE OF payload ON records
    WHEN OLD.sealed & 4 BEGIN
    DELETE FROM media_pending WHERE session_id = OLD.session_id AND seq = OLD.seq AND what = 'p';
END;
CREATE TRIGGER IF NOT EXISTS media_pending_audio AFTER UPDATE OF audio ON records
    WHEN OLD.sealed & 8 BEGIN
    DELETE FROM media_pending WHERE session_id = OLD.session_id AND seq = OLD.seq AND what = 'a';
END;
CREATE TRIGGER IF NOT EXISTS media_pending_row AFTER DELETE ON records
    WHEN OLD.sealed & 12 BEGIN
    DELETE FROM media_pending WHERE session_id = OLD.session_id AND seq = OLD.seq;
END;
"""
# columns a database made before media was sealed out lacks
ADDED_COLUMNS = {
    "records": {"audio": "BLOB", "sealed": "INTEGER NOT NULL DEFAULT 0"},
    "sessions": {"media_expired": "INTEGER NOT NULL DEFAULT 0"},
}
BULK_COLUMNS = "audio, sealed"  # what a read selects beside the record and its payload
_COLUMN = {SEALED_PAYLOAD: "payload", SEALED_AUDIO: "audio"}
_BIT_OF = {"p": SEALED_PAYLOAD, "a": SEALED_AUDIO}
_PENDING_OF = {SEALED_PAYLOAD: PENDING_PAYLOAD, SEALED_AUDIO: PENDING_AUDIO}
INSERT_PENDING = "INSERT INTO media_pending (session_id, seq, what, value) VALUES (?, ?, ?, ?)"


class MediaElsewhere(LogError):
    """``--media-dir`` names a place other than the one the database's media is in."""


def migrate(conn: sqlite3.Connection) -> None:
    """Add what sealing media needs to a database of any earlier version."""
    conn.executescript(SCHEMA)
    for table, columns in ADDED_COLUMNS.items():
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        for name, kind in columns.items():
            if name not in present:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


def bulk_columns(conn: sqlite3.Connection) -> str:
    """:data:`BULK_COLUMNS`, or stand-ins for them in a database made before
    them (the audit tools open it read-only, so it is not migrated)."""
    present = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
    return BULK_COLUMNS if {"audio", "sealed"} <= present else "NULL, 0"


def normal_location(location: str) -> str:
    """An object store's URL as given; a folder as its absolute path."""
    return location if location.startswith(S3_SCHEME) else str(Path(location).resolve())


def recorded_location(conn: sqlite3.Connection) -> str | None:
    """Where this database's media lives (None: nowhere, or a database
    older than sealed media)."""
    try:
        row = conn.execute("SELECT value FROM store_settings WHERE name = 'media'").fetchone()
    except sqlite3.OperationalError:  # no such table: made before media was sealed out
        return None
    return row[0] if row else None


def media_location(conn: sqlite3.Connection, given: str | None) -> str | None:
    """The media location to use: the one given (recorded on first use) or
    the one recorded; a given one that differs from the record is refused."""
    recorded = recorded_location(conn)
    if given is None:
        return recorded
    wanted = normal_location(given)
    if recorded is not None and recorded != wanted:
        raise MediaElsewhere(
            f"--media-dir {given}: this database's media is in {recorded} "
            "(give that, or leave --media-dir out)"
        )
    if recorded is None:
        conn.execute("INSERT INTO store_settings (name, value) VALUES ('media', ?)", (wanted,))
    return wanted


def held_apart(session_id: str, rows: list[StoredRecord]) -> tuple[list[tuple], list[tuple]]:
    """New rows as inserted with a media folder: each bulk value replaced by
    a reference's room and marked pending, and the ``media_pending`` rows
    that hold the values meanwhile."""
    records, pending = [], []
    for row in rows:
        bits, payload, audio = 0, row.payload, row.audio
        if payload is not None:
            pending.append((session_id, row.seq, "p", payload))
            payload, bits = REF_ROOM, bits | PENDING_PAYLOAD
        if audio is not None:
            pending.append((session_id, row.seq, "a", audio))
            audio, bits = REF_ROOM, bits | PENDING_AUDIO
        records.append(
            (session_id, row.seq, row.kind, row.event_id, row.blob, payload)
            + (row.server_event_seq, row.twin, audio, bits)
        )
    return records, pending


def pending_values(
    conn: sqlite3.Connection, session_id: str, from_seq: int
) -> dict[tuple[int, str], bytes]:
    """The session's values waiting in ``media_pending`` from ``from_seq``
    on, by (seq, ``p`` or ``a``)."""
    rows = conn.execute(
        "SELECT seq, what, value FROM media_pending WHERE session_id = ? AND seq >= ?",
        (session_id, from_seq),
    )
    return {(seq, what): value for seq, what, value in rows}


def with_pending(
    session_id: str,
    seq: int,
    payload: bytes | None,
    audio: bytes | None,
    sealed: int,
    pending: dict[tuple[int, str], bytes],
) -> tuple[bytes | None, bytes | None]:
    """A row's payload and audio with the values that wait apart put back
    (a column emptied since holds nothing, whatever its bits say)."""
    if sealed & PENDING_PAYLOAD and payload is not None:
        payload = _pending(session_id, seq, "p", pending)
    if sealed & PENDING_AUDIO and audio is not None:
        audio = _pending(session_id, seq, "a", pending)
    return payload, audio


def _pending(session_id: str, seq: int, what: str, pending: dict[tuple[int, str], bytes]) -> bytes:
    value = pending.get((seq, what))
    if value is None:  # the triggers keep the two together: never a placeholder's zeros
        raise StorageUnavailable(f"{session_id} {what}{seq}: pending, and not in media_pending")
    return value


def bulk_values(seq: int, payload: bytes | None, audio: bytes | None) -> dict[str, bytes]:
    """A new row's bulk, by the names the sealer gives back: ``p<seq>`` and ``a<seq>``."""
    values = {}
    if payload is not None:
        values[f"p{seq}"] = payload
    if audio is not None:
        values[f"a{seq}"] = audio
    return values


def unsealed_values(
    seq: int, payload: bytes | None, audio: bytes | None, sealed: int
) -> dict[str, bytes]:
    """What of a stored row's bulk is still held whole (a crash came before its seal)."""
    return bulk_values(
        seq,
        payload if not sealed & SEALED_PAYLOAD else None,
        audio if not sealed & SEALED_AUDIO else None,
    )


def swap(conn: sqlite3.Connection, session_id: str, refs: dict[str, bytes]) -> int:
    """The segment holding ``refs`` is durable: list it for the session and
    swap each value still present (not trimmed, compacted or expired
    meanwhile) for its reference, in the caller's transaction."""
    present = conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,))
    if present.fetchone() is None:
        return 0  # deleted while its segment was written
    digests = {decode_ref(ref).digest.hex() for ref in refs.values()}
    conn.executemany(
        "INSERT OR IGNORE INTO media_segments (session_id, digest) VALUES (?, ?)",
        [(session_id, digest) for digest in digests],
    )
    swapped = 0
    for name, ref in refs.items():
        bit = _BIT_OF[name[0]]
        column = _COLUMN[bit]
        cursor = conn.execute(
            f"UPDATE records SET {column} = ?, sealed = (sealed | ?) & ~? WHERE session_id = ? "
            f"AND seq = ? AND {column} IS NOT NULL AND sealed & ? = 0",
            (ref, bit, _PENDING_OF[bit], session_id, int(name[1:]), bit),
        )
        swapped += cursor.rowcount
    return swapped


def segment_digests(conn: sqlite3.Connection, session_id: str) -> set[str]:
    """Every segment sealed for the session, named by a row or not any more."""
    rows = conn.execute("SELECT digest FROM media_segments WHERE session_id = ?", (session_id,))
    return {row[0] for row in rows}


def expire(conn: sqlite3.Connection, session_id: str) -> set[str]:
    """``--media-retention-s``: drop the session's bulk, sealed or not, and
    its listing, and mark it; returns the segments to delete once this
    commits (a crash before leaves files, never a reference to nothing)."""
    doomed = segment_digests(conn, session_id)
    conn.execute(
        "UPDATE records SET payload = NULL, audio = NULL, sealed = 0 WHERE session_id = ? "
        "AND (payload IS NOT NULL OR audio IS NOT NULL)",
        (session_id,),
    )
    conn.execute("DELETE FROM media_segments WHERE session_id = ?", (session_id,))
    conn.execute("UPDATE sessions SET media_expired = 1 WHERE session_id = ?", (session_id,))
    return doomed


def resolved(
    session_id: str,
    seq: int,
    payload: bytes | None,
    audio: bytes | None,
    sealed: int,
    segments: SegmentReader | None,
) -> tuple[bytes | None, bytes | None]:
    """A row's payload and audio, what its references name read back
    (checked by digest). Blocking: a segment is a file or an object."""
    if sealed & SEALED_PAYLOAD and payload is not None:
        payload = _read(session_id, f"P{seq}", payload, segments)
    if sealed & SEALED_AUDIO and audio is not None:
        audio = _read(session_id, f"A{seq}", audio, segments)
    return payload, audio


def _read(session_id: str, what: str, ref: bytes, segments: SegmentReader | None) -> bytes:
    if segments is None:
        raise StorageUnavailable(
            f"{session_id} {what}: sealed into a media segment, and no media folder is open"
        )
    return segments.resolve(session_id, what, ref)
