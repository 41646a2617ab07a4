"""Client commands -> records, one handler per event type (run by ``core/pipeline.step``).

A handler first validates against the current state (raising
:class:`ProtocolError` before recording anything), then adds facts and
outbound events to the batch. What the actor must do outside the log
(start or stop an answer, keep a turn's audio, trim the journal, close) is
returned as typed values (``core/effects.py``), in the order they are done.

The handlers live by topic, each module short enough to read whole:
``session`` (session.update), ``lifecycle`` (acks, close), ``input_audio``
(appends), ``input_turn`` (commit, clear, cancel, text, server VAD),
``items`` (conversation.item.*), ``responses`` (create, cancel) and
``output`` (the output audio: clear, barge-in, overlap, playback acks).
What several of them use is in ``shared`` and ``context``. Only this module
imports the topic modules: it builds ``CLIENT_HANDLERS`` and dispatches a
turn.signal through it, and re-exports what the rest of the server imports
from ``core.commands``.
"""

from __future__ import annotations

import msgspec

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands.given import (
    NOT_PREPARED,
    NOTHING_HEARD,
    Handler,
    HeardTurn,
    ModelFacts,
    Prepared,
    PreparedAppend,
)
from duplex_server.sessions.core.commands.input_audio import (
    MAX_INPUT_MS,
    MAX_VIDEO_FRAME_BYTES,
    MAX_VIDEO_FRAMES,
    append_format,
    audio_append,
    decode_append,
)
from duplex_server.sessions.core.commands.input_turn import (
    audio_clear,
    audio_commit,
    input_cancel,
    speech_transition,
    tell_transcription_error,
    text_append,
)
from duplex_server.sessions.core.commands.items import (
    dtmf_pressed,
    item_create,
    item_delete,
    item_retrieve,
    item_truncate,
)
from duplex_server.sessions.core.commands.lifecycle import event_ack, session_close
from duplex_server.sessions.core.commands.output import (
    barge_in,
    output_clear,
    overlap_decision,
    playback_ack,
)
from duplex_server.sessions.core.commands.responses import (
    respond_to_input,
    response_cancel,
    response_create,
)
from duplex_server.sessions.core.commands.session import check_session_patch, session_update
from duplex_server.sessions.core.commands.shared import next_user_item_id, start_answer
from duplex_server.sessions.core.effects import Effects
from duplex_server.sessions.core.gates import refuse_gated
from duplex_server.sessions.core.items import item_text
from duplex_server.sessions.core.turns import OverlapAction
from protocol import client_events as ce
from protocol.errors import ProtocolError


def turn_signal(batch: Batch, event: ce.TurnSignal, facts: ModelFacts) -> Effects:
    """An external turn signal (a client-side VAD, a push-to-talk button, a
    supervisor): the event it names, with ``payload`` as that event's fields,
    applied as if the client had sent it."""
    if event.event == "barge_in":
        return barge_in(batch, event, facts)
    fields = {**event.payload, "type": event.event, "event_id": event.event_id}
    try:
        signalled = msgspec.convert(fields, ce.CLIENT_EVENT_TYPES[event.event])
    except msgspec.ValidationError as exc:
        raise ProtocolError(
            "invalid_event",
            f"turn.signal {event.event}: {exc}",
            param=f"payload{_path_of(str(exc))}",
            event_id=event.event_id,
        ) from None
    # The event it carries needs what that event needs (a truncate, truncation).
    if (refusal := refuse_gated(batch.state, signalled, batch.capabilities)) is not None:
        raise refusal
    return CLIENT_HANDLERS[type(signalled)](batch, signalled, facts)


def _path_of(message: str) -> str:
    """``.session.voice`` from msgspec's "... - at `$.session.voice`"."""
    _, _, where = message.partition("- at `$")
    return where.rstrip("`")


CLIENT_HANDLERS: dict[type, Handler] = {
    ce.SessionUpdateEvent: session_update,
    ce.SessionEventAck: event_ack,
    ce.SessionClose: session_close,
    ce.InputAudioAppend: audio_append,
    ce.InputAudioCommit: audio_commit,
    ce.InputCommit: audio_commit,
    ce.InputAudioClear: audio_clear,
    ce.InputCancel: input_cancel,
    ce.InputTextAppend: text_append,
    ce.InputDtmf: dtmf_pressed,
    ce.ItemCreate: item_create,
    ce.ItemRetrieve: item_retrieve,
    ce.ItemDelete: item_delete,
    ce.ItemTruncate: item_truncate,
    ce.ResponseCreate: response_create,
    ce.ResponseCancel: response_cancel,
    ce.OutputAudioClear: output_clear,
    ce.BargeIn: barge_in,
    ce.TurnSignal: turn_signal,
    ce.PlaybackAck: playback_ack,
}
# Answered by the socket's attachment, never stepped: a resume (it picks the
# session) and a heartbeat (a liveness signal, not recorded).
SOCKET_EVENTS = (ce.SessionResume, ce.SessionHeartbeat)
# Another spelling of an event (vLLM-Omni's, the native one) is a subclass
# with its own tag: it is handled as the event it spells.
for _spelling in ce.CLIENT_EVENT_TYPES.values():
    if _spelling not in CLIENT_HANDLERS and _spelling not in SOCKET_EVENTS:
        CLIENT_HANDLERS[_spelling] = next(
            CLIENT_HANDLERS[base] for base in _spelling.__mro__ if base in CLIENT_HANDLERS
        )


__all__ = [
    "CLIENT_HANDLERS",
    "MAX_INPUT_MS",
    "MAX_VIDEO_FRAMES",
    "MAX_VIDEO_FRAME_BYTES",
    "SOCKET_EVENTS",
    "NOTHING_HEARD",
    "NOT_PREPARED",
    "Handler",
    "HeardTurn",
    "ModelFacts",
    "Prepared",
    "PreparedAppend",
    "OverlapAction",
    "append_format",
    "audio_append",
    "audio_commit",
    "check_session_patch",
    "decode_append",
    "item_text",
    "next_user_item_id",
    "overlap_decision",
    "respond_to_input",
    "speech_transition",
    "start_answer",
    "tell_transcription_error",
]
