"""Pure helpers that read a log back into a live actor's caches and budgets."""

from __future__ import annotations

from duplex_server.sessions.core.records import (
    AudioBody,
    FrameBody,
    ItemBody,
    OutBody,
    Record,
    UnitBody,
)
from duplex_server.sessions.core.state import SessionState


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
    """The pcm of the last ``count`` user items, read back from their records."""
    found: list[tuple[str, bytes]] = []
    for item in reversed(state.items):
        if len(found) == count:
            break
        refs = [p.audio_ref for p in item.parts if p.audio_ref is not None]
        if item.role != "user" or not refs:
            continue
        pcm = b"".join(_samples(records[first - 1 : last]) for first, last in refs)
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
    """Audio samples and video frames the records hold (a session's media budget)."""
    total = 0
    for record in records:
        body = record.body
        if isinstance(body, AudioBody):
            total += len(body.pcm)
        elif isinstance(body, FrameBody):
            total += len(body.data)
        elif isinstance(body, ItemBody):
            total += sum(len(audio) for audio in body.audio)
    return total
