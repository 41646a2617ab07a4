"""Helpers that read a log back into a live actor's state, caches and budgets.

A long session's log holds ``snapshot`` records: a restore reads from the
latest one (and the few records before it its caches still need,
``SnapshotBody.tail_from``), not from seq 1, so its cost is bounded by the
snapshot interval, not by the call's length.
"""

from __future__ import annotations

from duplex_server.sessions.core.records import (
    SNAPSHOT_VERSION,
    AudioBody,
    FrameBody,
    ItemBody,
    OutBody,
    Record,
    SnapshotBody,
    UnitBody,
)
from duplex_server.sessions.core.state import SessionState, apply, decode_snapshot
from duplex_server.sessions.log.store import SessionLog
from duplex_server.sessions.runtime.turn_feed import RECENT_TURNS


def latest_snapshot_at(records: list[Record]) -> int:
    """The index in ``records`` of the latest snapshot a fold may start from
    (0 when none: the fold starts at the first record)."""
    for index in range(len(records) - 1, -1, -1):
        body = records[index].body
        if isinstance(body, SnapshotBody) and body.version == SNAPSHOT_VERSION:
            return index
    return 0


def fold_tail(records: list[Record], state: SessionState) -> SessionState:
    """The fold of a whole log, from its latest snapshot on: ``records`` may
    start anywhere at or before that snapshot (a tail read) or at seq 1."""
    for record in records[latest_snapshot_at(records) :]:
        apply(state, record)
    return state


async def read_tail(log: SessionLog, session_id: str, units: int = 0) -> list[Record]:
    """What a restore needs of the log: from the latest snapshot's
    ``tail_from`` on, reaching back further only for the ``units`` latest
    ``unit`` records a native model rebuilds from. The whole log where it
    has no snapshot (an old log, a short session)."""
    at = await log.latest_snapshot(session_id)
    if at == 0:
        return await log.read(session_id)
    records = await log.read(session_id, after_seq=at - 1)
    head = records[0].body if records else None
    if not isinstance(head, SnapshotBody) or head.version != SNAPSHOT_VERSION:
        return await log.read(session_id)
    start = min(head.tail_from or at, at)
    if start < at:
        records = await log.read(session_id, after_seq=start - 1)
    need = min(units, _decoded_units(head))
    while start > 1 and len(stepped_units(records)) < need:
        start = max(1, start - 2 * len(records))  # doubling: at most twice what is needed
        records = await log.read(session_id, after_seq=start - 1)
    return records


def _decoded_units(body: SnapshotBody) -> int:
    return decode_snapshot(body).units_stepped


def tail_from(state: SessionState, journal_seq: int | None) -> int:
    """The oldest seq a restore reads for its caches: the journal's oldest
    unacknowledged event (``journal_seq``) and the recent user turns' audio."""
    oldest = state.last_seq + 1
    if journal_seq is not None:
        oldest = min(oldest, journal_seq)
    turns = 0
    for item in reversed(state.items):
        if turns == RECENT_TURNS:
            break
        refs = [p.audio_ref for p in item.parts if p.audio_ref is not None]
        if item.role != "user" or not refs:
            continue
        turns += 1
        oldest = min(oldest, *(first for first, _ in refs))
    return oldest


def journal_entries(records: list[Record]) -> list[tuple[int, bytes]]:
    return [
        (r.body.server_event_seq, r.body.payload)
        for r in records
        if isinstance(r.body, OutBody) and not r.body.trimmed
    ]


def stepped_units(records: list[Record]) -> list[UnitBody]:
    """The units a native duplex model stepped, oldest first (``unit`` records)."""
    return [r.body for r in records if isinstance(r.body, UnitBody)]


def recent_turn_audio(
    state: SessionState, records: list[Record], count: int
) -> list[tuple[str, bytes]]:
    """The pcm of the last ``count`` user items, read back from their records
    (``records`` are consecutive from any seq: a tail read)."""
    base = records[0].seq if records else 1
    found: list[tuple[str, bytes]] = []
    for item in reversed(state.items):
        if len(found) == count:
            break
        refs = [p.audio_ref for p in item.parts if p.audio_ref is not None]
        if item.role != "user" or not refs:
            continue
        pcm = b"".join(
            _samples(records[max(0, first - base) : max(0, last - base + 1)])
            for first, last in refs
        )
        if pcm:
            found.append((item.id, pcm))
    found.reverse()
    return found


def _samples(records: list[Record]) -> bytes:
    chunks: list[bytes] = []
    for record in records:
        if isinstance(record.body, AudioBody):
            chunks.append(record.body.pcm)
        elif isinstance(record.body, ItemBody):
            chunks.extend(record.body.audio)
    return b"".join(chunks)


def media_bytes(records: list[Record]) -> int:
    """Audio samples and video frames the records hold (a session's media
    budget); a snapshot stands for every record before it."""
    total = 0
    for record in records:
        body = record.body
        if isinstance(body, SnapshotBody):
            total = body.media_bytes
        elif isinstance(body, AudioBody):
            total += len(body.pcm)
        elif isinstance(body, FrameBody):
            total += len(body.data)
        elif isinstance(body, ItemBody):
            total += sum(len(audio) for audio in body.audio)
    return total
