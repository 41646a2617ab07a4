"""The model's output audio as the client plays it: clearing it, a barge-in, the
overlap decision hearing makes when speech comes over the answer, and playback
acknowledgements (what was heard, and when playback started and ended)."""

from __future__ import annotations

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands.given import ModelFacts
from duplex_server.sessions.core.commands.shared import _stopping
from duplex_server.sessions.core.effects import Effects
from duplex_server.sessions.core.records import (
    AckBody,
    DecisionBody,
    FenceReason,
    SignalBody,
    SignalName,
)
from duplex_server.sessions.core.responses import cancel_response, played_through
from duplex_server.sessions.core.snapshot import ledger
from duplex_server.sessions.core.state import ACK_SLACK_MS, Response
from duplex_server.sessions.core.turns import OverlapAction, OverlapReason
from protocol import client_events as ce
from protocol.errors import ProtocolError
from protocol.server_events import (
    InputCleared,
    OutputAudioCleared,
    OutputAudioStarted,
    OutputAudioStopped,
    OverlapDecision,
    OverlapMetadata,
    PlaybackAcknowledged,
    PlaybackEvent,
)


def _stop_output(batch: Batch, signal: SignalName, reason: FenceReason) -> Effects:
    # OpenAI's event names a response: the one cut, else the last one played.
    cleared = batch.state.response or batch.state.last_response
    batch.fact(SignalBody(signal=signal))
    aborted = cancel_response(batch, reason)
    batch.emit(
        OutputAudioCleared(response_id=cleared.id if cleared else "", epoch=batch.state.epoch)
    )
    return _stopping(aborted)


def overlap_decision(
    batch: Batch,
    action: OverlapAction,
    overlap_ms: float,
    response_id: str | None,
    reason: str = "",
    words: str | None = None,
) -> Effects:
    """What speech over the assistant leads to, logged (an ``overlap.decision``
    record on every endpoint) and told to a client that takes extensions; a
    barge-in also stops the answer (kept in history as far as it was played).
    ``reason``: why (``turns.OverlapReason``; empty, the action's usual one)."""
    reason = reason or _USUAL_REASON[action]
    batch.fact(
        DecisionBody(
            action="overlap.decision",
            response_id=response_id,
            reason=reason,
            overlap=action,
            overlap_ms=round(overlap_ms, 3),
            words=words,
        ),
        origin="server",
    )
    batch.emit(
        OverlapDecision(
            action=action,
            reason=reason,
            response_id=response_id,
            metadata=OverlapMetadata(overlap_ms=round(overlap_ms, 3)),
            policy=batch.state.config.overlap_policy,
        )
    )
    if action == "barge_in":
        return _stop_output(batch, "barge_in", "barge_in")
    if action == "drop":
        batch.fact(SignalBody(signal="input.clear"))  # the remark is not a turn
        batch.emit(InputCleared(epoch=batch.state.epoch))
    return ()


_USUAL_REASON: dict[OverlapAction, OverlapReason] = {
    "drop": "short_overlap",
    "listen": "listen_only",
    "barge_in": "speech_over_answer",
}


def output_clear(batch: Batch, event: ce.OutputAudioClear, facts: ModelFacts) -> Effects:
    state = batch.state
    if event.response_id is not None and state.find_response(event.response_id) is None:
        raise ProtocolError(
            "response_not_found",
            f"no response {event.response_id!r} to clear",
            param="response_id",
            event_id=event.event_id,
        )
    return _stop_output(batch, "output_audio.clear", "output_cleared")


def barge_in(batch: Batch, event: ce.ClientEvent, facts: ModelFacts) -> Effects:
    model = facts.model
    if not model.capabilities.supports_barge_in:
        raise ProtocolError(
            "capability_unsupported",
            f"model {model.name!r} does not support barge_in",
            param="type",
            event_id=event.event_id,
        )
    return _stop_output(batch, "barge_in", "barge_in")


def playback_ack(batch: Batch, event: ce.PlaybackAck, facts: ModelFacts) -> Effects:
    state = batch.state
    response = state.find_response(event.response_id)
    if response is None and event.item_id is not None:
        response = next(
            (
                r
                for r in (state.response, state.last_response)
                if r is not None and r.item_id == event.item_id
            ),
            None,
        )
    if response is None:
        raise ProtocolError(
            "response_not_found",
            "no response to acknowledge playback for",
            param="response_id",
            event_id=event.event_id,
        )
    committed = event.committed_ms if event.committed_ms is not None else event.played_ms
    played_before = response.playback.played_ms
    batch.fact(
        AckBody(
            what="playback",
            played_ms=event.played_ms,
            committed_ms=committed,
            truncate=event.truncate,
            response_id=response.id,
        )
    )
    item = state.find_item(response.item_id)
    history_committed = (
        item is not None
        and response.status != "in_progress"
        and (
            (item.history_ms or 0.0) + ACK_SLACK_MS >= response.playback.generated_ms
            or item.truncated
        )
    )
    wire_ledger = ledger(response.playback)
    if played_before <= 0 < response.playback.played_ms:
        batch.emit(OutputAudioStarted(response_id=response.id), response_id=response.id)
    batch.emit(
        PlaybackAcknowledged(
            response_id=response.id,
            item_id=response.item_id,
            playback=wire_ledger,
            history_committed=history_committed,
            truncated=bool(item and item.truncated),
            event=PlaybackEvent(
                played_ms=event.played_ms,
                committed_ms=committed,
                truncate=event.truncate,
                playback=wire_ledger,
                history_committed=history_committed,
                item_id=response.item_id,
            ),
        ),
        response_id=response.id,
    )
    if _played_to_the_end(response, played_before):
        batch.emit(OutputAudioStopped(response_id=response.id), response_id=response.id)
    return ()


def _played_to_the_end(response: Response, played_before: float) -> bool:
    """This ack carried a finished response's playback to its end."""
    finished = response.status != "in_progress" and played_through(response)
    return finished and played_before + ACK_SLACK_MS < response.playback.generated_ms
