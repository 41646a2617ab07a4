"""Records as the durable backends store them.

A stored record is split in two: the record itself (msgpack, without its
bulk bytes) and the bulk that retention may drop later without touching the
record: an outbound event's wire payload (trimmed once acknowledged) and,
where the backend asks for it, audio samples: the input (compacted once its
turn is acknowledged) and the units a native duplex model heard. Dropping
bulk never changes what the fold sees.

A beta event that directly follows its GA twin carries the same content in
another spelling; it is stored without payload and rebuilt byte-exactly on
read. Audio deltas go out in both spellings, so this halves what they cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from duplex_server.sessions.core.records import (
    AudioBody,
    ItemBody,
    OutBody,
    Record,
    UnitBody,
    server_event_id,
)
from protocol.server_events import BETA_TWIN

record_encoder = msgspec.msgpack.Encoder()
record_decoder = msgspec.msgpack.Decoder(Record)
_audio_list = msgspec.msgpack.Decoder(list[bytes])

# beta tag -> GA tag
_GA_OF = {beta.__struct_config__.tag: ga.__struct_config__.tag for ga, beta in BETA_TWIN.items()}


class StoredRecord(NamedTuple):
    seq: int
    kind: str
    event_id: str | None
    blob: bytes  # the record without payload (and without audio when split)
    payload: bytes | None  # an outbound payload; None for twins and other kinds
    server_event_seq: int | None
    twin: bool
    audio: bytes | None  # split audio: pcm, or a created item's msgpack list of pcm


def _split_audio(record: Record) -> tuple[Record, bytes | None]:
    body = record.body
    if isinstance(body, (AudioBody, UnitBody)) and body.pcm:
        return msgspec.structs.replace(record, body=msgspec.structs.replace(body, pcm=b"")), (
            body.pcm
        )
    if isinstance(body, ItemBody) and any(body.audio):
        stripped = msgspec.structs.replace(body, audio=[b"" for _ in body.audio])
        return msgspec.structs.replace(record, body=stripped), record_encoder.encode(body.audio)
    return record, None


def encode_records(records: list[Record], *, split_audio: bool = False) -> list[StoredRecord]:
    rows = []
    previous: OutBody | None = None
    for record in records:
        body = record.body
        if not isinstance(body, OutBody):
            audio = None
            if split_audio:
                record, audio = _split_audio(record)
            rows.append(
                StoredRecord(
                    record.seq,
                    record.kind,
                    record.event_id,
                    record_encoder.encode(record),
                    None,
                    None,
                    False,
                    audio,
                )
            )
            previous = None
            continue
        twin = previous is not None and _GA_OF.get(body.event_type) == previous.event_type
        stripped = msgspec.structs.replace(record, body=msgspec.structs.replace(body, payload=b""))
        rows.append(
            StoredRecord(
                record.seq,
                record.kind,
                record.event_id,
                record_encoder.encode(stripped),
                None if twin else body.payload,
                body.server_event_seq,
                twin,
                None,
            )
        )
        previous = body
    return rows


def _twin_payload(ga_payload: bytes, body: OutBody, session_id: str) -> bytes:
    event = msgspec.json.decode(ga_payload)
    event["type"] = body.event_type
    event["event_id"] = server_event_id(session_id, body.server_event_seq)
    event["server_event_seq"] = body.server_event_seq
    return msgspec.json.encode(event)


def _join_audio(record: Record, audio: bytes) -> None:
    body = record.body
    if isinstance(body, (AudioBody, UnitBody)):
        record.body = msgspec.structs.replace(body, pcm=audio)
    elif isinstance(body, ItemBody):
        record.body = msgspec.structs.replace(body, audio=_audio_list.decode(audio))


def decode_records(
    session_id: str, rows: Iterable[tuple[Record, bytes | None, bool | None, bytes | None]]
) -> list[Record]:
    """Records with their bulk put back, from (record, payload, twin, audio) in seq order.

    A missing payload means the event was trimmed; a twin is trimmed with
    the GA event it is rebuilt from. ``twin=None`` infers it: a payload-less
    beta event right after its GA twin is one (twins never store a payload).
    """
    out: list[Record] = []
    previous: tuple[str, bytes | None] | None = None  # (event type, payload) of an out
    for record, payload, twin, audio in rows:
        body = record.body
        if isinstance(body, OutBody):
            if twin is None:
                twin = (
                    payload is None
                    and previous is not None
                    and _GA_OF.get(body.event_type) == previous[0]
                )
            if twin:
                source = previous[1] if previous is not None else None
                payload = _twin_payload(source, body, session_id) if source is not None else None
            record.body = msgspec.structs.replace(
                body, payload=payload or b"", trimmed=payload is None
            )
            previous = (body.event_type, payload)
        else:
            previous = None
            if audio is not None:
                _join_audio(record, audio)
        out.append(record)
    return out
