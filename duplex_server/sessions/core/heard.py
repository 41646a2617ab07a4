"""What the server decided from what it heard, as commands.

Server VAD, partial transcripts and speech over the answer are worked out
in the runtime (``runtime/hearing.py`` scores audio and transcribes it off
the actor). What it decides comes back as one of these commands and goes
through the same pipeline as a client's event (``core/pipeline.py``): a
handler adds records and events to a batch, the runtime appends it, then
applies the effects. So a VAD commit is the client's commit handler run on
the server's word, and hearing never writes to the session itself.
"""

from __future__ import annotations

from dataclasses import replace

import msgspec

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import (
    NOTHING_HEARD,
    Handler,
    HeardTurn,
    ModelFacts,
    OverlapAction,
    audio_commit,
    next_user_item_id,
    overlap_decision,
    respond_to_input,
    speech_transition,
    start_answer,
    tell_transcription_error,
)
from duplex_server.sessions.core.config import vad_responds
from duplex_server.sessions.core.effects import Effects
from duplex_server.sessions.core.records import DecisionBody
from duplex_server.sessions.core.turns import Transition
from protocol import client_events as ce
from protocol.server_events import InputTimeoutTriggered, InputTranscriptionDelta


class SpeechStart(msgspec.Struct, frozen=True):
    """Speech began at ``at_ms``; ``cut_answer``: the answer in progress
    stops now (OpenAI semantics) rather than when the speech is sustained."""

    at_ms: float
    cut_answer: bool = False


class OverlapResolved(msgspec.Struct, frozen=True):
    """Speech over the answer lasted the barge-in threshold: what it leads to,
    and why (``turns.OverlapReason``; empty: the action's usual reason), with
    the words heard in it where they decided."""

    action: OverlapAction
    overlap_ms: float
    response_id: str
    reason: str = ""
    words: str | None = None


class OverlapHinted(msgspec.Struct, frozen=True):
    """Without server VAD: speech over the answer judged from the client's
    hints or the audio's energy (``turns.HintedOverlap``)."""

    action: OverlapAction
    overlap_ms: float
    response_id: str


class RemarkDropped(msgspec.Struct, frozen=True):
    """A short remark over the answer ended: the answer goes on, the remark
    is not a turn (``reason``: ``short_overlap`` when empty, or
    ``backchannel_words`` with the ``words`` that made it one)."""

    at_ms: float
    overlap_ms: float
    response_id: str
    reason: str = ""
    words: str | None = None


class TurnEnded(msgspec.Struct, frozen=True):
    """The speech stopped: commit the turn, answered as the turn detection
    settings say (``response_create``), or ``deferred`` until the answer
    playing now ends (``listen_only``)."""

    at_ms: float
    response_create: bool | None = None
    deferred: bool = False


class TurnJudged(msgspec.Struct, frozen=True):
    """semantic_vad: the end-of-turn model heard the turn up to a pause after
    speech ending at ``at_ms``; its ``probability`` that the turn is over, and
    whether that ends it (the eagerness's threshold). Logged, so a refold
    never runs the model; a finished turn's commit follows as a TurnEnded."""

    at_ms: float
    probability: float
    finished: bool


class InputTrimmed(msgspec.Struct, frozen=True):
    """Between turns the buffer keeps only the last ``keep_ms`` of silence."""

    keep_ms: float


class PartialHeard(msgspec.Struct, frozen=True):
    """More words of the speech going on, for the item it will become."""

    item_id: str
    delta: str


class DeferredTurnDue(msgspec.Struct, frozen=True):
    """The answer a turn waited for ended: answer that turn now."""


class IdleTimedOut(msgspec.Struct, frozen=True):
    """No speech from ``start_ms`` to ``end_ms`` (input audio time) after the
    answer played: ``turn_detection.idle_timeout_ms`` (runtime/idle_timer.py)."""

    start_ms: float
    end_ms: float


HeardCommand = (
    SpeechStart
    | OverlapResolved
    | OverlapHinted
    | RemarkDropped
    | TurnEnded
    | TurnJudged
    | InputTrimmed
    | PartialHeard
    | DeferredTurnDue
    | IdleTimedOut
)


def speech_start(batch: Batch, command: SpeechStart, facts: ModelFacts) -> Effects:
    speech_transition(batch, Transition("speech_started", command.at_ms))
    response = batch.state.response
    if response is not None and command.cut_answer:
        return overlap_decision(batch, "barge_in", 0.0, response.id, "speech_started")
    return ()


def overlap_resolved(batch: Batch, command: OverlapResolved, facts: ModelFacts) -> Effects:
    response = batch.state.response
    if command.action == "barge_in" and (response is None or response.id != command.response_id):
        return ()  # the answer ended while its words were awaited: nothing to cut
    return overlap_decision(
        batch,
        command.action,
        command.overlap_ms,
        command.response_id,
        command.reason,
        command.words,
    )


def overlap_hinted(batch: Batch, command: OverlapHinted, facts: ModelFacts) -> Effects:
    if batch.state.response is None or batch.state.response.id != command.response_id:
        return ()  # the answer ended before the decision ran
    return overlap_decision(batch, command.action, command.overlap_ms, command.response_id)


def remark_dropped(batch: Batch, command: RemarkDropped, facts: ModelFacts) -> Effects:
    speech_transition(batch, Transition("speech_stopped", command.at_ms))
    return overlap_decision(
        batch, "drop", command.overlap_ms, command.response_id, command.reason, command.words
    )


def turn_ended(
    batch: Batch, command: TurnEnded, facts: ModelFacts, heard: HeardTurn = NOTHING_HEARD
) -> Effects:
    # A failed recognition is told first, as for a client's commit.
    tell_transcription_error(batch, heard)
    speech_transition(batch, Transition("speech_stopped", command.at_ms))
    if not batch.state.input.chunks and not batch.state.input.text:
        # Two utterances in one append: the first commit took all of it.
        return ()
    respond = (
        False if command.deferred else vad_responds(batch.state.config, command.response_create)
    )
    commit = ce.InputAudioCommit(response_create=respond)
    # The silence the VAD waited for before it called the speech over.
    hangover_ms = max(batch.state.input.end_ms - command.at_ms, 0.0)
    return audio_commit(
        batch, commit, facts, replace(heard, error=None), vad_hangover_ms=hangover_ms
    )


def turn_judged(batch: Batch, command: TurnJudged, facts: ModelFacts) -> Effects:
    batch.fact(
        DecisionBody(
            action="turn_judged",
            audio_ms=command.at_ms,
            item_id=next_user_item_id(batch.state),
            probability=command.probability,
            reason="finished" if command.finished else "unfinished",
        ),
        origin="server",
    )
    return ()


def input_trimmed(batch: Batch, command: InputTrimmed, facts: ModelFacts) -> Effects:
    batch.fact(DecisionBody(action="input_trimmed", audio_ms=command.keep_ms), origin="server")
    return ()


def partial_heard(batch: Batch, command: PartialHeard, facts: ModelFacts) -> Effects:
    batch.emit(InputTranscriptionDelta(item_id=command.item_id, delta=command.delta))
    return ()


def deferred_turn_due(batch: Batch, command: DeferredTurnDue, facts: ModelFacts) -> Effects:
    return respond_to_input(batch, facts.model)


def idle_timed_out(batch: Batch, command: IdleTimedOut, facts: ModelFacts) -> Effects:
    """OpenAI's idle timeout: tell it, commit the silent buffer as the user's
    turn and answer it (a buffer the VAD trimmed to nothing: answer anyway)."""
    batch.emit(
        InputTimeoutTriggered(
            audio_start_ms=round(command.start_ms),
            audio_end_ms=round(command.end_ms),
            item_id=next_user_item_id(batch.state),
        )
    )
    if batch.state.input.chunks:
        return audio_commit(batch, ce.InputAudioCommit(response_create=True), facts)
    return start_answer(batch)


HEARD_HANDLERS: dict[type, Handler] = {
    SpeechStart: speech_start,
    OverlapResolved: overlap_resolved,
    OverlapHinted: overlap_hinted,
    RemarkDropped: remark_dropped,
    TurnEnded: turn_ended,
    TurnJudged: turn_judged,
    InputTrimmed: input_trimmed,
    PartialHeard: partial_heard,
    DeferredTurnDue: deferred_turn_due,
    IdleTimedOut: idle_timed_out,
}
