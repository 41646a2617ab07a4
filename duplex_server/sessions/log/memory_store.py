"""In-process log backend, for tests, benchmarks and ``--store memory``."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec

from duplex_server.sessions.core.records import AudioBody, ItemBody, OutBody, Record
from duplex_server.sessions.log.store import (
    EVENT_ID_WINDOW,
    DuplicateEvent,
    LocalLeases,
    SequenceConflict,
    SessionRow,
    StaleFence,
    UnknownSession,
)


@dataclass
class _Stream:
    records: list[Record] = field(default_factory=list)
    fence: int = 0
    owner: str = ""
    event_ids: OrderedDict[str, int] = field(default_factory=OrderedDict)
    trimmed_upto: int = 0
    # Where the next trim / compaction resumes: both walk forward only, so an
    # ack costs what it trims, not the length of the session.
    trim_index: int = 0
    compacted_upto: int = 0
    snapshot_seq: int = 0  # the latest ``snapshot`` record's, 0 for none


class MemoryLog(LocalLeases):
    durable = False

    def __init__(self, event_id_window: int = EVENT_ID_WINDOW) -> None:
        self._streams: dict[str, _Stream] = {}
        self._window = event_id_window

    def _stream(self, session_id: str) -> _Stream:
        try:
            return self._streams[session_id]
        except KeyError:
            raise UnknownSession(session_id) from None

    async def create(self, session_id: str) -> None:
        self._streams.setdefault(session_id, _Stream())

    async def acquire_lease(
        self,
        session_id: str,
        owner: str,
        *,
        expect_fence: int | None = None,
        handoff: bool = False,
    ) -> int:
        stream = self._stream(session_id)
        if expect_fence is not None and expect_fence != stream.fence:
            raise StaleFence(f"fence moved from {expect_fence} to {stream.fence}")
        stream.fence += 1
        stream.owner = owner
        return stream.fence

    async def append(self, session_id: str, records: list[Record], fence: int) -> list[int]:
        stream = self._stream(session_id)
        if fence < stream.fence:
            raise StaleFence(f"fence {fence} < current {stream.fence} for {session_id}")
        for record in records:
            if record.event_id is not None and record.event_id in stream.event_ids:
                raise DuplicateEvent(record.event_id, stream.event_ids[record.event_id])
        next_seq = len(stream.records) + 1
        seqs = [record.seq for record in records]
        if seqs != list(range(next_seq, next_seq + len(records))):
            raise SequenceConflict(
                f"{session_id}: batch seqs {seqs[:3]}... do not follow {next_seq - 1}"
            )
        for record in records:
            if record.event_id is not None:
                stream.event_ids[record.event_id] = record.seq
        while len(stream.event_ids) > self._window:
            stream.event_ids.popitem(last=False)
        stream.records.extend(records)
        for record in records:
            if record.kind == "snapshot":
                stream.snapshot_seq = record.seq
        return seqs

    async def latest_snapshot(self, session_id: str) -> int:
        return self._stream(session_id).snapshot_seq

    async def read(self, session_id: str, after_seq: int = 0) -> list[Record]:
        records = self._stream(session_id).records
        # seqs are dense from 1, so the index of seq N is N - 1.
        return records[after_seq:]

    async def trim(self, session_id: str, upto_server_event_seq: int) -> int:
        stream = self._stream(session_id)
        if upto_server_event_seq <= stream.trimmed_upto:
            return 0
        trimmed = 0
        index = stream.trim_index
        records = stream.records
        while index < len(records):
            record = records[index]
            body = record.body
            if isinstance(body, OutBody) and not body.trimmed:
                if body.server_event_seq > upto_server_event_seq:
                    break
                records[index] = msgspec.structs.replace(
                    record, body=msgspec.structs.replace(body, payload=b"", trimmed=True)
                )
                trimmed += 1
            index += 1
        stream.trim_index = index
        stream.trimmed_upto = upto_server_event_seq
        return trimmed

    async def compact_audio(self, session_id: str, upto_seq: int) -> int:
        stream = self._stream(session_id)
        changed = 0
        start = stream.compacted_upto
        stream.compacted_upto = max(start, upto_seq)
        for index, record in enumerate(stream.records[start:upto_seq], start=start):
            body = record.body
            if isinstance(body, AudioBody) and body.pcm:
                body = msgspec.structs.replace(body, pcm=b"")
            elif isinstance(body, ItemBody) and any(body.audio):
                body = msgspec.structs.replace(body, audio=[b"" for _ in body.audio])
            else:
                continue
            stream.records[index] = msgspec.structs.replace(record, body=body)
            changed += 1
        return changed

    async def delete(self, session_id: str) -> None:
        self._streams.pop(session_id, None)

    async def sessions(self, *, open_only: bool = False) -> list[SessionRow]:
        rows = []
        for session_id, stream in self._streams.items():
            closed = any(r.kind == "close" for r in stream.records)
            if open_only and closed:
                continue
            last = stream.records[-1] if stream.records else None
            rows.append(
                SessionRow(
                    session_id=session_id,
                    fence=stream.fence,
                    owner=stream.owner,
                    last_seq=last.seq if last else 0,
                    trimmed_upto=stream.trimmed_upto,
                    closed=closed,
                    last_ts_ms=last.ts_ms if last else 0,
                )
            )
        return rows

    async def read_open_sessions(self) -> dict[str, list[Record]]:
        return {
            row.session_id: list(self._streams[row.session_id].records)
            for row in await self.sessions(open_only=True)
        }

    async def close(self) -> None:
        self._streams.clear()
