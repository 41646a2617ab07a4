"""Build the records one command produces.

Each record is applied to the actor's state as it is added, so an outbound
event is always built from the state it describes and carries the next
``server_event_seq``. Nothing leaves the process until the whole batch is in
the log; if the log refuses it, the actor refolds its state from the log.
"""

from __future__ import annotations

from duplex_server.sessions.core.event_dialect import as_sent
from duplex_server.sessions.core.records import (
    AnyBody,
    FenceBody,
    Origin,
    OutBody,
    Record,
    server_event_id,
)
from duplex_server.sessions.core.state import SessionState, apply, turn_phase
from protocol.capabilities import Capabilities
from protocol.codec import encode_server_event
from protocol.server_events import ServerEvent, TurnEvent


class Batch:
    def __init__(
        self,
        state: SessionState,
        capabilities: Capabilities,
        now_ms: int,
        event_id: str | None = None,
        event_digest: str | None = None,
    ) -> None:
        self.state = state
        self.capabilities = capabilities
        self.now_ms = now_ms
        self.records: list[Record] = []
        self.outbound: list[tuple[int, bytes]] = []
        # The client event this batch answers, kept after its first record took
        # the id: a batch that cannot be appended is refused under this name.
        self.answers = event_id
        self._event_id = event_id
        self._event_digest = event_digest
        self._phase = turn_phase(state)  # as the last turn.event told it
        self._settled = 0  # records already looked at by settle()

    def fact(self, body: AnyBody, origin: Origin = "client") -> Record:
        # The client's event_id rides on the first record only: that is the
        # one the log deduplicates on, the rest are its consequences.
        event_id, self._event_id = self._event_id, None
        digest, self._event_digest = self._event_digest, None
        # The actor is the session's only writer, so it knows the next seq;
        # the backend checks it (and the fence) when the batch is appended.
        record = Record(
            epoch=self.state.epoch,
            ts_ms=self.now_ms,
            origin=origin,
            body=body,
            event_id=event_id,
            seq=self.state.last_seq + 1,
            event_digest=digest,
        )
        apply(self.state, record)
        self.records.append(record)
        return record

    def settle(self) -> None:
        """Tell who has the floor now, if the batch changed it: one
        ``turn.event`` after everything else the batch says (a barge-in is
        told first, as what happened, then the phase it left). Idempotent:
        the step and the actor's append both call it. Nothing follows the
        ``session.closed`` of a closing batch."""
        state = self.state
        if state.closed_reason is not None:
            return
        fresh, self._settled = self.records[self._settled :], len(self.records)
        if any(isinstance(r.body, FenceBody) and r.body.reason == "barge_in" for r in fresh):
            self.emit(TurnEvent(event="barge_in", turn_id=state.turn_id, epoch=state.epoch))
        phase = turn_phase(state)
        if phase != self._phase:
            self._phase = phase
            self.emit(TurnEvent(event=phase, turn_id=state.turn_id, epoch=state.epoch))
        self._settled = len(self.records)

    def emit(
        self,
        event: ServerEvent,
        *,
        response_id: str | None = None,
        audio_ms: float = 0.0,
        text: str = "",
        stage_ms: dict[str, float] | None = None,
    ) -> None:
        sent = as_sent(event, self.state.config.sends_extensions)
        if sent is None:
            return
        event = sent
        seq = self.state.server_event_seq + 1
        event.server_event_seq = seq
        event.event_id = server_event_id(self.state.session_id, seq)
        payload = encode_server_event(event)
        self.fact(
            OutBody(
                server_event_seq=seq,
                event_type=event.__struct_config__.tag,  # type: ignore[arg-type]  # tags are str
                payload=payload,
                response_id=response_id,
                audio_ms=audio_ms,
                text=text,
                stage_ms=stage_ms,
            ),
            origin="server",
        )
        self.outbound.append((seq, payload))
