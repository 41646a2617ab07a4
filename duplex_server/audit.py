"""``duplex-server inspect`` and ``replay``: read a session store after an incident.

Both open the database read-only, so they are safe beside a running server.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

import msgspec

from duplex_server.models import build_model
from duplex_server.sessions.core import records as r
from duplex_server.sessions.core.state import fold, initial_state
from duplex_server.sessions.log.sqlite_store import SqliteReader


def _when(ts_ms: int) -> str:
    return dt.datetime.fromtimestamp(ts_ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def list_sessions(reader: SqliteReader) -> list[str]:
    lines = [f"{'session':36}  {'state':6}  {'records':>7}  {'fence':>5}  last activity (UTC)"]
    for row in reader.sessions():
        state = "closed" if row.closed else "open"
        when = _when(row.last_ts_ms) if row.last_ts_ms else "-"
        lines.append(f"{row.session_id:36}  {state:6}  {row.last_seq:>7}  {row.fence:>5}  {when}")
    return lines


def _summary(body: r.AnyBody) -> str:
    describe: dict[type, Callable] = {
        r.ConfigBody: lambda b: (
            "session.update "
            + json.dumps(msgspec.to_builtins(b.patch), separators=(",", ":"))[:120]
        ),
        r.AudioBody: lambda b: (
            f"{b.duration_ms:.1f} ms {b.source_format}@{b.sample_rate_hz}"
            + (" (compacted)" if not b.pcm else "")
        ),
        r.FrameBody: lambda b: f"frame {len(b.data)} bytes at {b.audio_ms:.0f} ms",
        r.UnitBody: lambda b: (
            f"#{b.index} tokens={b.tokens}" + (" silence" if b.silence else f" {len(b.pcm)} bytes")
        ),
        r.TextBody: lambda b: repr(b.text[:80]),
        r.CommitBody: lambda b: f"{b.item_id or '(silence)'} respond={b.response_create}",
        r.ItemBody: lambda b: f"{b.op} {b.item_id}",
        r.AckBody: lambda b: (
            f"playback played={b.played_ms:.0f} committed={b.committed_ms:.0f}"
            f"{' truncate' if b.truncate else ''} {b.response_id or ''}"
            if b.what == "playback"
            else f"event_ack {b.server_event_seq}"
        ),
        r.SignalBody: lambda b: b.signal + (f" {b.response_id}" if b.response_id else ""),
        r.FenceBody: lambda b: f"epoch -> {b.new_epoch} ({b.reason})",
        r.DecisionBody: lambda b: " ".join(
            x for x in (b.action, b.response_id or "", b.status or "", b.reason) if x
        ),
        r.OutBody: lambda b: (
            f"#{b.server_event_seq} {b.event_type}" + (" (trimmed)" if b.trimmed else "")
        ),
        r.CallBody: lambda b: f"{b.carrier} call {b.call_id} stream {b.stream_id}",
        r.LeaseBody: lambda b: f"{b.action} gen={b.generation} fence={b.fence} owner={b.owner}",
        r.CloseBody: lambda b: b.reason,
        r.JobBody: lambda b: (
            f"{b.route} "
            + b.params.decode(errors="replace")[:120]
            + "".join(f" input={_blob(ref)}" for ref in b.inputs)
            + (f" key={b.idempotency_key!r}" if b.idempotency_key else "")
        ),
        r.ProgressBody: lambda b: f"{b.percent}% {b.detail}".rstrip(),
        r.ResultBody: lambda b: (
            f"{b.status} {b.http_status}"
            + (f" output={_blob(b.output)}" if b.output else "")
            + "".join(f" {name}={_blob(ref)}" for name, ref in b.assets.items())
            + (f" {b.error_code} ({b.error_param}): {b.error_message}" if b.error_code else "")
        ),
    }
    return describe[type(body)](body)


def _blob(ref: r.BlobRef) -> str:
    """A blob as the log knows it: its digest (the file's name) and size."""
    return f"sha256:{ref.digest[:16]}.. {ref.size} bytes {ref.content_type}"


def show_log(reader: SqliteReader, session_id: str) -> list[str]:
    lines = []
    for record in reader.records(session_id):
        event = f" [{record.event_id}]" if record.event_id else ""
        line = (
            f"{record.seq:>6}  {_when(record.ts_ms)}  e{record.epoch:<3} {record.origin:8} "
            f"{record.kind:8} {_summary(record.body)}{event}"
        )
        lines.append(printable(line))
    return lines


def printable(text: str) -> str:
    """Clients choose event ids and texts: escape what a terminal would act
    on (escape sequences, carriage returns) instead of printing it raw."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _readable(value: object) -> object:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, dict):
        return {k: _readable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_readable(v) for v in value]
    return value


def replay_state(reader: SqliteReader, session_id: str, model_name: str = "echo") -> str:
    """Refold the log from scratch and print the state it yields."""
    model = build_model(model_name)
    state = fold(
        reader.records(session_id),
        initial_state(session_id, model.name, model.turn_detection_types),
    )
    builtins = msgspec.to_builtins(state, enc_hook=lambda v: v, builtin_types=(bytes,))
    return json.dumps(_readable(builtins), indent=2)
