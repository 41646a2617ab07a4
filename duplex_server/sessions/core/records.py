"""Log record types (DESIGN.md, "The log").

A record's ``kind`` is the tag of its body, so the two cannot disagree.
Bodies hold typed facts only: anything the fold needs is a field here, never
something re-parsed from an outbound payload.
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec

from duplex_server.sessions.core.items import Item
from protocol.client_events import ResponseOverrides
from protocol.session_config import SessionUpdate

Origin = Literal["client", "server", "engine", "manager"]


class Body(msgspec.Struct, tag_field="kind", omit_defaults=True, gc=False):
    """Records are the most numerous objects in the server and never form
    cycles, so the cyclic collector does not track them (``gc=False``)."""


class ConfigBody(Body, tag="config"):
    """A ``session.update`` patch (or the route's opening defaults).

    ``openai_semantics`` is set by the opening record only: True for a plain
    ``/v1/realtime`` socket, which gets OpenAI's behaviour where ``?duplex=1``
    differs (PROTOCOL.md's table)."""

    patch: SessionUpdate
    openai_semantics: bool | None = None
    # The principal (API key name) that opened the session: set by the
    # opening record only; resume and the log routes are its alone.
    owner: str | None = None


class AudioBody(Body, tag="audio"):
    """One input chunk, already converted to pcm16 at ``sample_rate_hz``."""

    pcm: bytes
    sample_rate_hz: int
    source_format: str
    duration_ms: float
    audio_end_ms: float | None = None
    is_speech: bool | None = None
    speech_probability: float | None = None
    transcript: str | None = None  # what the client says was said in it
    overlap_hint: str | None = None  # drop | listen | barge_in, if the client forced one


class FrameBody(Body, tag="frame"):
    data: bytes
    audio_ms: float


class UnitBody(Body, tag="unit"):
    """One unit a native full-duplex model stepped, and the tokens it
    generated from it: its state (KV cache, codec state) is a cache of these
    records, rebuilt after a crash or takeover by a teacher-forced prefill.

    ``pcm`` is exactly what the model heard (pcm16 at its own rate, after
    the session's resampling and framing, pauses clocked by the server
    included); empty for a clocked unit of pure silence (zeros). The input,
    not the codec's codes of it, because the codec's streaming state (its
    convolutions' tails, its transformer's cache) is a function of the
    samples (docs/decisions/moshi-batch-and-resume.md, "the duplex model's frames in the log").
    ``tokens`` are the model's own output for the unit as it feeds them
    back (Moshi: the text token, then one code per codebook). Its size is
    bounded by one unit (80 ms at 24 kHz: 3,840 bytes).
    """

    index: int  # on the model's input timeline, from 0
    tokens: list[int]
    pcm: bytes = b""
    silence: bool = False


class TextBody(Body, tag="text"):
    text: str


class CommitBody(Body, tag="commit"):
    item_id: str
    response_create: bool
    is_speech: bool = True
    final: bool = False
    # What the model's speech recognition heard (empty: none ran or nothing heard).
    transcript: str = ""
    # How long the turn's stages took (vad_hangover_ms, asr_final_ms): the
    # response that answers it reports them (STAGE_METRICS in DESIGN terms).
    stage_ms: dict[str, float] = msgspec.field(default_factory=dict)


ItemOp = Literal["create", "delete", "truncate"]


class ItemBody(Body, tag="item"):
    op: ItemOp
    item_id: str
    item: Item | None = None
    # pcm16 of the created item's audio parts, in order (compactable).
    audio: list[bytes] = msgspec.field(default_factory=list)
    previous_item_id: str | None = None
    content_index: int = 0
    audio_end_ms: float = 0.0
    response_id: str | None = None  # the response whose output it is (a model's tool call)


class AckBody(Body, tag="ack"):
    """``playback.ack`` (``what="playback"``) or ``session.event_ack`` (``"event"``)."""

    what: Literal["playback", "event"]
    played_ms: float = 0.0
    committed_ms: float = 0.0
    truncate: bool = False
    response_id: str | None = None
    server_event_seq: int = 0


SignalName = Literal[
    "barge_in",
    "response.create",
    "response.cancel",
    "heartbeat",  # written by servers before session 9; heartbeats are not recorded now
    "output_audio.clear",
    "input.clear",
    "input.cancel",
]


class SignalBody(Body, tag="signal"):
    signal: SignalName
    response_id: str | None = None
    overrides: ResponseOverrides | None = None


FenceReason = Literal[
    "client_cancelled",
    "output_cleared",
    "barge_in",
    "input_cancelled",
    "new_response",
    "session_ended",  # expiry or shutdown cut the answer
]


class FenceBody(Body, tag="fence"):
    reason: FenceReason
    new_epoch: int


DecisionAction = Literal[
    "speak",
    "listen",
    "response_done",
    "speech_started",
    "speech_stopped",
    "input_trimmed",
    "turn_judged",
    "overlap.decision",
]
ResponseStatus = Literal["completed", "cancelled", "failed", "incomplete"]


class DecisionBody(Body, tag="decision"):
    action: DecisionAction
    response_id: str | None = None
    item_id: str | None = None
    reason: str = ""
    status: ResponseStatus | None = None
    modalities: list[str] = msgspec.field(default_factory=list)
    overrides: ResponseOverrides | None = None
    requested: bool = False  # speak: a client's response.create asked for it
    # speech_started / speech_stopped / turn_judged: on the input timeline;
    # input_trimmed: how much of the buffer to keep (the prefix padding)
    audio_ms: float = 0.0
    # turn_judged (semantic_vad): the end-of-turn model's probability that the
    # turn is finished; ``reason`` says what it decided ("finished" or not)
    probability: float | None = None
    # overlap.decision: what speech over the answer ``response_id`` led to
    # (``reason`` says why), how long it was when decided, and the words the
    # recogniser heard in it where they decided; logged on every endpoint
    # (the OpenAI one sends no event for it), so a refold reads the decision
    overlap: Literal["drop", "listen", "barge_in"] | None = None
    overlap_ms: float | None = None
    words: str | None = None


class OutBody(Body, tag="out"):
    """One journaled server event; ``payload`` is exactly what goes on the wire.

    ``audio_ms``/``text`` carry what the event adds to the active response so
    the fold can keep the playback ledger and transcript without parsing JSON.
    ``payload`` is emptied (``trimmed``) once the client acknowledged it.
    """

    server_event_seq: int
    event_type: str
    payload: bytes
    response_id: str | None = None
    audio_ms: float = 0.0
    text: str = ""
    trimmed: bool = False
    stage_ms: dict[str, float] | None = None  # the model's stage times (tts_first_clause_ms)


LeaseAction = Literal["attach", "detach", "resume", "replace", "takeover"]


class LeaseBody(Body, tag="lease"):
    action: LeaseAction
    owner: str
    fence: int
    generation: int
    token_hash: str | None = None


CloseReason = Literal[
    "client_close",
    "disconnect",
    "timeout",
    "transport_error",
    "shutdown",
    "disconnect_grace_expired",
    "idle_ttl_expired",
    "job_finished",  # a one-shot job session (batch API) recorded its result
]


class CloseBody(Body, tag="close"):
    reason: CloseReason
    detail: str | None = None  # the client's own words (session.close's reason)


# The carrier of a call that came by WebRTC (``POST /v1/realtime/calls``).
WEBRTC_CARRIER = "webrtc"


class CallBody(Body, tag="call"):
    """A call reached the session through a carrier or by WebRTC (recorded
    at the opening): which carrier (``webrtc`` for a WebRTC call), the
    call's and the stream's ids, and a phone call's numbers. The numbers are
    personal data: kept here as the call's record (the session's log is the
    caller's own, behind the API key) and redacted from the server's log
    lines."""

    carrier: str
    call_id: str
    stream_id: str
    caller: str = ""
    called: str = ""

    @property
    def resumable(self) -> bool:
        """A WebRTC call comes back with a new offer; a carrier never
        streams a call to a restarted server again."""
        return self.carrier == WEBRTC_CARRIER


SNAPSHOT_VERSION = 1


class SnapshotBody(Body, tag="snapshot"):
    """The session's folded state as of the record before this one, so a
    refold starts here instead of at seq 1 (docs/DECISIONS.md, "Snapshots").

    ``state`` is the msgpack of ``SessionState`` (``version`` says which
    shape; a reader that does not know it folds the full log instead).
    ``media_bytes``: media the records before it hold (the session's byte
    budget). ``tail_from``: the oldest seq a restored actor still reads for
    its caches (the journal's unacknowledged events, recent turns' audio).
    """

    state: bytes
    version: int = SNAPSHOT_VERSION
    media_bytes: int = 0
    tail_from: int = 0


# --- one-shot job sessions (the batch API) ------------------------------------

# A job session's id starts with this: the realtime manager leaves such
# sessions to the job runner (recovery, expiry, purge), which reads them.
JOB_SESSION_PREFIX = "job_"


def is_job_session(session_id: str) -> bool:
    return session_id.startswith(JOB_SESSION_PREFIX)


class BlobRef(msgspec.Struct, frozen=True, gc=False):
    """Media kept in the blob store: the log holds only where to find it."""

    digest: str  # sha256 of the bytes, hex: the blob's name
    size: int
    content_type: str = "application/octet-stream"


class JobBody(Body, tag="job"):
    """What a one-shot job was asked, before anything ran: enough to run it
    again after a crash. ``params`` is the request's validated body as JSON;
    ``request_digest`` covers the body and the uploads, so a retry under the
    same ``idempotency_key`` is the same request only if the digests match."""

    route: str
    params: bytes
    request_digest: str
    idempotency_key: str | None = None
    inputs: list[BlobRef] = msgspec.field(default_factory=list)


class ProgressBody(Body, tag="progress"):
    """How far a long job (a video) has come, 0-100."""

    percent: int
    detail: str = ""


JobStatus = Literal["completed", "failed"]


class ResultBody(Body, tag="result"):
    """What a job produced: the response body as a blob (``output``), or the
    error it ended with (the HTTP status and OpenAI-style error fields), so an
    idempotent retry answers exactly as the first request was answered.
    ``assets``: media made from the body beside it, by name (a video's
    ``thumbnail`` and ``spritesheet``), kept and deleted with the job."""

    status: JobStatus
    http_status: int = 200
    output: BlobRef | None = None
    metadata: bytes = b"{}"  # JSON: what the route reports beside the body
    error_code: str | None = None
    error_message: str | None = None
    error_param: str | None = None
    assets: dict[str, BlobRef] = msgspec.field(default_factory=dict)


AnyBody = Union[
    ConfigBody,
    AudioBody,
    FrameBody,
    UnitBody,
    TextBody,
    CommitBody,
    ItemBody,
    AckBody,
    SignalBody,
    FenceBody,
    DecisionBody,
    OutBody,
    LeaseBody,
    CloseBody,
    CallBody,
    SnapshotBody,
    JobBody,
    ProgressBody,
    ResultBody,
]


class Record(msgspec.Struct, gc=False):
    """``(seq, kind, epoch, ts_ms, origin, event_id?, body)``; ``seq`` set by the backend."""

    epoch: int
    ts_ms: int
    origin: Origin
    body: AnyBody
    event_id: str | None = None
    seq: int = 0
    # A digest of the client event the record answers (with ``event_id``):
    # a later event under the same id is a retry only if its digest matches.
    event_digest: str | None = None

    @property
    def kind(self) -> str:
        return self.body.__struct_config__.tag  # type: ignore[return-value]  # tags are kinds


def server_event_id(session_id: str, server_event_seq: int) -> str:
    """The ``event_id`` of an outbound event: derived, so stores need not keep it."""
    return f"event_{session_id[-8:]}_{server_event_seq}"


class RecordLine(msgspec.Struct):
    """The JSON-lines shape of a record (``GET /v1/sessions/{id}/events``)."""

    seq: int
    kind: str
    epoch: int
    ts_ms: int
    origin: str
    event_id: str | None
    body: AnyBody


def to_line(record: Record) -> RecordLine:
    return RecordLine(
        record.seq,
        record.kind,
        record.epoch,
        record.ts_ms,
        record.origin,
        record.event_id,
        record.body,
    )
