"""A long Redis session's old records, out of Redis (issue 41): flat memory.

Once a session has a snapshot, a refold, a recovery and a resume start
from it (``latest_snapshot``), so what comes before it is read only for an
audit, a replay or an old cursor. When enough records wait behind the
latest snapshot, they are written to one archive segment in the media
folder (their stream entries as stored, and their bulk: sealed references
or bytes), and one script then trims them off the stream, drops their bulk
fields and lists the segment in ``<p>:{sid}:archive``. A read that reaches
back past ``archived_upto`` reads those segments first and goes on in the
stream, so every record is read as it was appended; a payload trimmed or
audio compacted after it was archived is dropped at read by the marks in
meta, as the live fields are. What Redis holds for a session is then its
records since about the last snapshot, however long the call.

The order is the sealer's: the segment is durable before anything leaves
Redis, and the script checks that no other archive ran meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from duplex_server.sessions.core.records import OutBody
from duplex_server.sessions.log.media import decode_ref
from duplex_server.sessions.log.record_codec import record_decoder

ARCHIVE_TYPE = "application/x-duplex-log-archive"
# records behind the latest snapshot before they are archived
ARCHIVE_RECORDS = 1000


class Archive(msgspec.Struct, array_like=True):
    """One segment's records: (seq, record, fence) as the stream held them,
    and the bulk fields that belonged to them. ``session_id`` makes the
    segment the session's own (see media.py's segment header)."""

    session_id: str
    entries: list[tuple[int, bytes, bytes]]
    bulk: dict[bytes, bytes]


class ArchivedRange(msgspec.Struct, array_like=True):
    """An entry of ``<p>:{sid}:archive``: seqs ``first..last`` in a segment."""

    first: int
    last: int
    digest: bytes
    size: int


_archive = msgspec.msgpack.Decoder(Archive)
_range = msgspec.msgpack.Decoder(ArchivedRange)
_encoder = msgspec.msgpack.Encoder()


def build(session_id: str, entries: list, bulk: dict[bytes, bytes]) -> tuple[bytes, list[bytes]]:
    """The archive of these stream entries (XRANGE's reply) and the bulk
    fields they own; returns its bytes and the fields to drop from Redis."""
    rows, owned = [], []
    for entry_id, fields in entries:
        seq = int(entry_id.split(b"-")[0])
        rows.append((seq, fields[b"r"], fields.get(b"f", b"")))
        record = record_decoder.decode(fields[b"r"])
        names = [b"a%d" % seq, b"u%d" % seq]
        if isinstance(record.body, OutBody):
            names.append(b"o%d" % record.body.server_event_seq)
        owned += [n for name in names for n in (name, name.upper()) if n in bulk]
    archive = Archive(session_id, rows, {name: bulk[name] for name in owned})
    return _encoder.encode(archive), owned


def encode_range(first: int, last: int, digest: str, size: int) -> bytes:
    return _encoder.encode(ArchivedRange(first, last, bytes.fromhex(digest), size))


def ranges(listed: Iterable[bytes]) -> list[ArchivedRange]:
    return [_range.decode(item) for item in listed]


def entries_of(data: bytes, from_seq: int) -> tuple[list, dict[bytes, bytes]]:
    """An archive's entries from ``from_seq`` on, shaped as XRANGE gives
    them, and its bulk fields."""
    archive = _archive.decode(data)
    entries = [
        (b"%d-0" % seq, {b"r": record, b"f": fence})
        for seq, record, fence in archive.entries
        if seq >= from_seq
    ]
    return entries, archive.bulk


def drop_retained(bulk: dict[bytes, bytes], trimmed_upto: int, compacted_upto: int) -> None:
    """Drop from an archive's bulk what retention dropped since it was
    written: payloads up to ``trimmed_upto``, input audio up to ``compacted_upto``."""
    for name in list(bulk):
        kind, number = name[:1].lower(), int(name[1:])
        if (kind == b"o" and number <= trimmed_upto) or (kind == b"a" and number <= compacted_upto):
            del bulk[name]


def media_digests(bulk: Iterable[tuple[bytes, bytes]]) -> set[str]:
    """The segments that sealed references in these bulk fields name."""
    return {
        decode_ref(value).digest.hex() for name, value in bulk if name[:1] in (b"A", b"O", b"U")
    }


def archive_media(data: bytes) -> set[str]:
    """The media segments an archive's bulk names."""
    return media_digests(_archive.decode(data).bulk.items())
