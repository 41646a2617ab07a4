"""The chaos bench's verdict: one client's witness held against its session's log.

Pure: it takes the records (read from the store after the run) and the
:class:`~duplex_bench.chaos_client.Witness`, and counts every way the
two disagree. Each count must be zero for the run to pass, except the
informational ones (``refused_but_logged``: an append whose outcome the
server could not know when it refused it, because the store went away with
the reply in flight; the client was told it failed and did not count it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from duplex_bench.chaos_client import Witness
from duplex_server.surface import LeaseBody, OutBody, Record, build_model, fold, initial_state


@dataclass
class Findings:
    acknowledged: int = 0
    records_lost: int = 0  # acknowledged, not in the log
    records_duplicated: int = 0  # acknowledged, in the log more than once
    records_misplaced: int = 0  # acknowledged, but the wrong kind of record or out of order
    journal_mismatches: int = 0  # an event the client saw is not the log's event at that seq
    journal_holes: int = 0  # the log's server_event_seq is not 1, 2, 3, ...
    client_gaps: int = 0  # the client's stream skipped a seq (a replay that missed one)
    client_duplicates: int = 0  # the client got one seq twice
    fold_mismatches: int = 0  # the refolded state disagrees with what the client saw
    fence_violations: int = 0  # lease records whose fence did not rise
    refused_but_logged: int = 0  # informational (see the module docstring)

    def merge(self, other: Findings) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    @property
    def clean(self) -> bool:
        return not any(
            value
            for name, value in asdict(self).items()
            if name not in ("acknowledged", "refused_but_logged")
        )


def audit(witness: Witness, records: list[Record], model_name: str = "echo") -> Findings:
    found = Findings(acknowledged=len(witness.acknowledged))
    _acknowledged_input(witness, records, found)
    _journal(witness, records, found)
    _fold(witness, records, model_name, found)
    found.fence_violations = _fence_violations(
        [r.body for r in records if isinstance(r.body, LeaseBody)]
    )
    return found


def _fence_violations(leases: list[LeaseBody]) -> int:
    """Fences never fall, and a lease that changes hands takes a higher one:
    a session is never served under one fence by two owners (a detach or a
    replaced socket on the same server keeps the fence it had)."""
    return sum(
        1
        for before, after in zip(leases, leases[1:], strict=False)
        if after.fence < before.fence
        or (after.owner != before.owner and after.fence == before.fence)
    )


def _acknowledged_input(witness: Witness, records: list[Record], found: Findings) -> None:
    """Every acknowledged input event is in the log once, as the record its
    kind makes, in the order the client sent it."""
    logged = [r for r in records if r.event_id is not None and r.origin == "client"]
    copies = Counter(r.event_id for r in logged)
    kinds = {r.event_id: r.kind for r in logged}
    wanted = {op.event_id for op in witness.acknowledged}
    for op in witness.acknowledged:
        count = copies.get(op.event_id, 0)
        if count == 0:
            found.records_lost += 1
        elif count > 1:
            found.records_duplicated += 1
        elif kinds[op.event_id] != op.kind:
            found.records_misplaced += 1
    once = {event_id for event_id in wanted if copies.get(event_id) == 1}
    in_log_order = [r.event_id for r in logged if r.event_id in once]
    sent_order = [op.event_id for op in witness.acknowledged if op.event_id in once]
    found.records_misplaced += sum(
        1 for a, b in zip(in_log_order, sent_order, strict=True) if a != b
    )
    found.refused_but_logged = sum(1 for event_id in witness.refused if copies.get(event_id))


def _journal(witness: Witness, records: list[Record], found: Findings) -> None:
    journal = {
        r.body.server_event_seq: r.body.event_type for r in records if isinstance(r.body, OutBody)
    }
    found.journal_holes = sum(
        1 for expected, seq in enumerate(sorted(journal), start=1) if seq != expected
    )
    found.journal_mismatches = sum(
        1 for seq, kind in witness.seen.items() if journal.get(seq) != kind
    )
    found.client_gaps = witness.gaps
    found.client_duplicates = witness.duplicates


def _fold(witness: Witness, records: list[Record], model_name: str, found: Findings) -> None:
    """The state a restart would rebuild is the conversation the client saw."""
    model = build_model(model_name)
    if witness.session_id is None:
        return
    state = fold(records, initial_state(witness.session_id, model.name, model.turn_detection_types))
    checks = [
        [item.id for item in state.items] == witness.items,
        state.turn_id == witness.turn_id,
        not witness.closed or state.server_event_seq == witness.cursor,
        witness.closed == (state.closed_reason is not None),
    ]
    found.fold_mismatches = checks.count(False)
