"""Session state and the pure fold ``state = reduce(apply, records, initial)``.

``apply`` reads nothing but the state and the record: no clock, randomness
or I/O. It mutates the state it is given (the fold's accumulator), which is
what keeps a live actor and a from-scratch refold byte-for-byte equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import msgspec

from duplex_server.sessions.core.config import EffectiveConfig, merge_config
from duplex_server.sessions.core.items import Item, Part, transcript_at
from duplex_server.sessions.core.records import (
    SNAPSHOT_VERSION,
    AckBody,
    AudioBody,
    CallBody,
    CloseBody,
    CommitBody,
    ConfigBody,
    DecisionBody,
    FenceBody,
    FrameBody,
    ItemBody,
    LeaseBody,
    OutBody,
    Record,
    SignalBody,
    SnapshotBody,
    TextBody,
    UnitBody,
)
from protocol.client_events import ResponseOverrides
from protocol.server_events import PlaybackLedger

RECENT_EVENT_IDS = 256


# The wire's ledger is rounded to microseconds of audio (snapshot.ledger): an
# ack that echoes it (a WebRTC call's track, a phone call's marks, a client
# acking what it was told) may fall this far short of the exact total.
ACK_SLACK_MS = 5e-4 + 1e-9


class Response(msgspec.Struct):
    id: str
    item_id: str
    epoch: int
    modalities: list[str]
    status: str = "in_progress"
    reason: str = ""
    playback: PlaybackLedger = msgspec.field(default_factory=PlaybackLedger)
    transcript: str = ""
    metadata: dict[str, str] | None = None  # the client's, echoed back as OpenAI does
    requested: bool = False  # a response.create asked for it (or was folded into it)
    overrides: ResponseOverrides | None = None  # that response.create's, if any
    # Its output items after the assistant message: the tool calls it made.
    call_item_ids: list[str] = msgspec.field(default_factory=list)
    # How long each stage took, ms: the turn's (VAD, ASR) and the model's (TTS).
    stage_ms: dict[str, float] = msgspec.field(default_factory=dict)


class InputBuffer(msgspec.Struct):
    chunks: list[bytes] = msgspec.field(default_factory=list)
    chunk_seqs: list[int] = msgspec.field(default_factory=list)  # record seq of each chunk
    chunk_ms: list[float] = msgspec.field(default_factory=list)
    first_seq: int = 0  # of the utterance's first audio record
    sample_rate_hz: int = 0
    audio_ms: float = 0.0
    text: str = ""
    end_ms: float = 0.0  # input timeline: audio_end_ms of the last chunk
    # The appends' own transcripts, joined: the user item's transcript when
    # the client sent one (it heard the speech; the server only guesses).
    client_transcript: str = ""


class Lease(msgspec.Struct):
    owner: str = ""
    fence: int = 0
    generation: int = 0
    token_hash: str | None = None
    attached: bool = False


class SessionState(msgspec.Struct):
    session_id: str
    config: EffectiveConfig
    turn_detection_types: tuple[str, ...] = ()
    epoch: int = 0
    turn_id: int = 0
    server_event_seq: int = 0
    acked_server_event_seq: int = 0
    last_seq: int = 0
    input: InputBuffer = msgspec.field(default_factory=InputBuffer)
    items: list[Item] = msgspec.field(default_factory=list)
    response: Response | None = None
    last_response: Response | None = None
    response_count: int = 0
    item_count: int = 0
    listen_count: int = 0
    units_stepped: int = 0  # units a native duplex model stepped (``unit`` records)
    # A committed user turn no answer or listen decision has taken up yet.
    turn_pending: bool = False
    turn_stage_ms: dict[str, float] = msgspec.field(default_factory=dict)  # the last turn's stages
    user_speaking: bool = False  # server VAD: between speech_started and speech_stopped
    # Input audio has been logged: a primed native model has heard its setup
    # (instructions, voice), which an update may no longer change.
    input_started: bool = False
    lease: Lease = msgspec.field(default_factory=Lease)
    # event_id -> (seq, digest) of the record it landed as, oldest first.
    recent_event_ids: dict[str, tuple[int, str | None]] = msgspec.field(default_factory=dict)
    closed_reason: str | None = None
    owner: str | None = None  # the principal that opened it (None: an open server's)
    call: CallBody | None = None  # a phone call's ids and numbers, when it is one

    def find_item(self, item_id: str) -> Item | None:
        for item in reversed(self.items):  # lookups are almost always of recent items
            if item.id == item_id:
                return item
        return None

    def find_response(self, response_id: str | None) -> Response | None:
        for response in (self.response, self.last_response):
            if response is not None and (response_id is None or response.id == response_id):
                return response
        return None


TurnPhase = Literal[
    "idle", "user_speaking", "user_committed", "assistant_generating", "assistant_playing"
]


def turn_phase(state: SessionState) -> TurnPhase:
    """Who has the floor, as ``turn.event`` tells it: the user speaking
    (server VAD, or a native model yielded to them), a committed turn
    waiting for its answer, the assistant generating (nothing sent yet) or
    playing (audio sent; after the answer is complete, until the client
    acknowledges playing all of it, where playback is acknowledged), or
    nobody."""
    if state.user_speaking:
        return "user_speaking"
    if (response := state.response) is not None:
        return "assistant_playing" if response.playback.sent_ms > 0 else "assistant_generating"
    if state.turn_pending:
        return "user_committed"
    last = state.last_response
    if last is not None and last.reason == "model_yield":
        return "user_speaking"  # a native model gave the floor to a user who talks
    playing = (
        last is not None
        and last.status == "completed"
        and state.config.playback_commit_policy == "ack_only"
        and last.playback.played_ms + ACK_SLACK_MS < last.playback.generated_ms
    )
    return "assistant_playing" if playing else "idle"


def initial_state(
    session_id: str, model: str, turn_detection_types: tuple[str, ...] = ()
) -> SessionState:
    return SessionState(
        session_id=session_id,
        config=EffectiveConfig(model=model),
        turn_detection_types=turn_detection_types,
    )


def fold(records: Iterable[Record], state: SessionState) -> SessionState:
    for record in records:
        apply(state, record)
    return state


def apply(state: SessionState, record: Record) -> None:
    state.last_seq = record.seq
    if record.event_id is not None:
        recent = state.recent_event_ids
        recent[record.event_id] = (record.seq, record.event_digest)
        if len(recent) > RECENT_EVENT_IDS:
            del recent[next(iter(recent))]
    _APPLY[type(record.body)](state, record.body, record.seq)


def _config(state: SessionState, body: ConfigBody, seq: int) -> None:
    state.config = merge_config(state.config, body.patch, state.turn_detection_types)
    if body.openai_semantics is not None:
        state.config.openai_semantics = body.openai_semantics
    if body.owner is not None:
        state.owner = body.owner


def _audio(state: SessionState, body: AudioBody, seq: int) -> None:
    state.input_started = True
    buf = state.input
    if not buf.chunks:
        buf.first_seq = seq
    buf.chunks.append(body.pcm)
    buf.chunk_seqs.append(seq)
    buf.chunk_ms.append(body.duration_ms)
    buf.sample_rate_hz = body.sample_rate_hz
    buf.audio_ms += body.duration_ms
    buf.end_ms = (
        body.audio_end_ms if body.audio_end_ms is not None else buf.end_ms + body.duration_ms
    )
    if body.transcript:
        buf.client_transcript += body.transcript


def _frame(state: SessionState, body: FrameBody, seq: int) -> None:
    """A video frame stays in the log (``inspect`` shows it) and folds to nothing:
    no part of the session reads frames."""


def _unit(state: SessionState, body: UnitBody, seq: int) -> None:
    """The model's own state is not the session's: only the count is folded
    (the runtime reads the records back to rebuild the model)."""
    state.units_stepped = body.index + 1


def _text(state: SessionState, body: TextBody, seq: int) -> None:
    state.input.text += body.text


def _commit(state: SessionState, body: CommitBody, seq: int) -> None:
    buf = state.input
    parts = []
    if buf.chunks:
        parts.append(
            Part(
                type="input_audio",
                audio_rate=buf.sample_rate_hz,
                audio_ms=buf.audio_ms,
                transcript=body.transcript or buf.text or None,
                audio_ref=(buf.first_seq, seq - 1),
            )
        )
    elif buf.text:
        parts.append(Part(type="input_text", text=buf.text))
    if body.is_speech and parts:
        state.items.append(Item(id=body.item_id, role="user", parts=parts))
        state.item_count += 1
        state.turn_id += 1
        state.turn_pending = True
        state.turn_stage_ms = dict(body.stage_ms)
    state.input = InputBuffer(end_ms=buf.end_ms)


def _item(state: SessionState, body: ItemBody, seq: int) -> None:
    if body.op == "create" and body.item is not None:
        # A copy: the record's item must never change when the live one does.
        item = msgspec.json.decode(msgspec.json.encode(body.item), type=Item)
        for part in item.parts:
            if part.audio_ms:
                part.audio_ref = (seq, seq)
        index = len(state.items)
        if body.previous_item_id is not None:
            index = next(
                (i + 1 for i, it in enumerate(state.items) if it.id == body.previous_item_id),
                index,
            )
        state.items.insert(index, item)
        state.item_count += 1
        response = state.response
        if response is not None and body.response_id == response.id:
            response.call_item_ids.append(item.id)
    elif body.op == "delete":
        state.items = [it for it in state.items if it.id != body.item_id]
    elif body.op == "truncate":
        cut = state.find_item(body.item_id)
        if cut is not None:
            truncate_item(cut, body.audio_end_ms)


def truncate_item(item: Item, end_ms: float) -> None:
    """Cut an assistant item's audio and transcript at ``end_ms`` for good."""
    for part in item.parts:
        if part.type == "audio":
            part.audio_ms = min(part.audio_ms, end_ms)
            part.transcript = transcript_at(item.marks, part.transcript or "", end_ms)
    item.history_ms = end_ms
    item.truncated = True
    item.status = "incomplete"


def _ack(state: SessionState, body: AckBody, seq: int) -> None:
    if body.what == "event":
        state.acked_server_event_seq = max(state.acked_server_event_seq, body.server_event_seq)
        return
    response = state.find_response(body.response_id)
    if response is None:
        return
    ledger = response.playback
    ledger.played_ms = max(ledger.played_ms, min(body.played_ms, ledger.generated_ms))
    ledger.committed_ms = max(ledger.committed_ms, min(body.committed_ms, ledger.played_ms))
    item = state.find_item(response.item_id)
    if item is None or item.truncated:
        return
    if body.truncate:
        truncate_item(item, ledger.played_ms)
    elif state.config.playback_commit_policy == "ack_only" or response.status == "in_progress":
        item.history_ms = max(item.history_ms or 0.0, ledger.committed_ms)


def _signal(state: SessionState, body: SignalBody, seq: int) -> None:
    """Most signals are audit facts whose effects are fences and decisions."""
    if body.signal in ("input.clear", "input.cancel"):
        state.input = InputBuffer(end_ms=state.input.end_ms)
    elif body.signal == "response.create" and body.response_id is not None:
        # folded into the auto-response that already answers the same input
        response = state.find_response(body.response_id)
        if response is not None:
            response.requested = True
            metadata = _metadata_of(body.overrides)
            if response.status == "in_progress" and metadata is not None:
                response.metadata = metadata  # echoed in its response.done


def _fence(state: SessionState, body: FenceBody, seq: int) -> None:
    state.epoch = body.new_epoch


def _decision(state: SessionState, body: DecisionBody, seq: int) -> None:
    if body.action == "listen":
        state.listen_count += 1
        state.turn_pending = False
    elif body.action == "speak":
        state.turn_pending = False
        _start_response(state, body)
    elif body.action == "response_done":
        _finish_response(state, body)
    elif body.action in ("speech_started", "speech_stopped"):
        state.user_speaking = body.action == "speech_started"
    elif body.action == "input_trimmed":
        _trim_input(state.input, body.audio_ms)


def _trim_input(buf: InputBuffer, keep_ms: float) -> None:
    """Drop the oldest whole chunks while at least ``keep_ms`` stays buffered
    (silence before speech, beyond the prefix padding, is not kept)."""
    while len(buf.chunks) > 1 and buf.audio_ms - buf.chunk_ms[0] >= keep_ms:
        buf.audio_ms -= buf.chunk_ms.pop(0)
        buf.chunks.pop(0)
        buf.chunk_seqs.pop(0)
    if buf.chunk_seqs:
        buf.first_seq = buf.chunk_seqs[0]


def _metadata_of(overrides: ResponseOverrides | None) -> dict[str, str] | None:
    """The client's metadata of a response.create, echoed as OpenAI does."""
    if overrides is None or overrides.metadata is msgspec.UNSET:
        return None
    return dict(overrides.metadata)


def _start_response(state: SessionState, body: DecisionBody) -> None:
    assert body.response_id is not None and body.item_id is not None
    part_type = "audio" if "audio" in body.modalities else "text"
    state.items.append(
        Item(
            id=body.item_id,
            role="assistant",
            status="in_progress",
            parts=[Part(type=part_type, transcript="" if part_type == "audio" else None)],
        )
    )
    state.item_count += 1
    state.response_count += 1
    state.response = Response(
        id=body.response_id,
        item_id=body.item_id,
        epoch=state.epoch,
        modalities=body.modalities,
        requested=body.requested,
        overrides=body.overrides,
        metadata=_metadata_of(body.overrides),
        stage_ms=state.turn_stage_ms,
    )
    state.turn_stage_ms = {}  # one response reports the turn's stages


def _finish_response(state: SessionState, body: DecisionBody) -> None:
    response = state.response
    if response is None or response.id != body.response_id:
        return
    response.status = body.status or "completed"
    response.reason = body.reason
    status = "completed" if response.status == "completed" else "incomplete"
    for call_item_id in response.call_item_ids:  # a cut-off call stands no more
        if (call := state.find_item(call_item_id)) is not None:
            call.status = status
    item = state.find_item(response.item_id)
    if item is not None and item.truncated:
        # Cut by a truncating ack while it was generated: the item keeps what
        # was spoken up to the cut, never what was generated after it.
        cut_ms = item.history_ms or 0.0
        for part in item.parts:
            if part.type == "audio":
                part.transcript = transcript_at(item.marks, response.transcript, cut_ms)
                part.audio_ms = min(response.playback.generated_ms, cut_ms)
        item.status = "incomplete"
    elif item is not None:
        item.status = status
        for part in item.parts:
            if part.type == "audio":
                part.transcript = response.transcript
                part.audio_ms = response.playback.generated_ms
            else:
                part.text = response.transcript
        # After a crash nobody knows what was played beyond the acks.
        trust_generation = body.reason != "server_restart"
        if state.config.playback_commit_policy == "commit_all_on_done" and trust_generation:
            item.history_ms = response.playback.generated_ms
        else:
            item.history_ms = response.playback.committed_ms
    state.last_response = response
    state.response = None


def _out(state: SessionState, body: OutBody, seq: int) -> None:
    state.server_event_seq = body.server_event_seq
    response = state.response
    if response is None or body.response_id != response.id:
        return
    if body.stage_ms:
        response.stage_ms.update(body.stage_ms)
    if body.audio_ms:
        response.playback.generated_ms += body.audio_ms
        response.playback.sent_ms += body.audio_ms
    if body.text:
        response.transcript += body.text
        item = state.find_item(response.item_id)
        if item is not None:
            item.marks.append((response.playback.generated_ms, len(response.transcript)))


def _call(state: SessionState, body: CallBody, seq: int) -> None:
    state.call = body


def _lease(state: SessionState, body: LeaseBody, seq: int) -> None:
    lease = state.lease
    lease.owner = body.owner
    lease.fence = body.fence
    lease.generation = body.generation
    if body.token_hash is not None:
        lease.token_hash = body.token_hash
    lease.attached = body.action != "detach"


def _close(state: SessionState, body: CloseBody, seq: int) -> None:
    state.closed_reason = body.reason
    state.lease.attached = False


_snapshot_decoder = msgspec.msgpack.Decoder(SessionState)
snapshot_encoder = msgspec.msgpack.Encoder()


def encode_snapshot(state: SessionState) -> bytes:
    return snapshot_encoder.encode(state)


def decode_snapshot(body: SnapshotBody) -> SessionState:
    return _snapshot_decoder.decode(body.state)


def _snapshot(state: SessionState, body: SnapshotBody, seq: int) -> None:
    """``state := the snapshot's``: it is the fold of every record before it,
    so a full fold and a fold that starts here agree (tests/test_snapshots)."""
    if body.version != SNAPSHOT_VERSION:
        return  # an older shape: the records before it are in this fold anyway
    saved = decode_snapshot(body)
    for field in state.__struct_fields__:
        setattr(state, field, getattr(saved, field))
    state.last_seq = seq


_APPLY: dict[type, Callable[[SessionState, Any, int], None]] = {
    ConfigBody: _config,
    AudioBody: _audio,
    FrameBody: _frame,
    UnitBody: _unit,
    TextBody: _text,
    CommitBody: _commit,
    ItemBody: _item,
    AckBody: _ack,
    SignalBody: _signal,
    FenceBody: _fence,
    DecisionBody: _decision,
    OutBody: _out,
    LeaseBody: _lease,
    CallBody: _call,
    CloseBody: _close,
    SnapshotBody: _snapshot,
}
