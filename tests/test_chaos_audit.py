"""The chaos bench's audit finds each way a log can betray its client.

A check that cannot fail proves nothing: each test breaks one thing in a
log that matches its witness and asserts the audit names that one thing.
"""

from __future__ import annotations

import copy

from duplex_bench.chaos_audit import audit
from duplex_bench.chaos_client import Op, Witness
from duplex_server.sessions.core.records import (
    AudioBody,
    LeaseBody,
    OutBody,
    Record,
)

SESSION = "sess_audit_000000000000000000"


def lease(seq: int, action: str, owner: str, fence: int) -> Record:
    body = LeaseBody(action=action, owner=owner, fence=fence, generation=fence)  # type: ignore[arg-type]
    return Record(epoch=0, ts_ms=0, origin="manager", body=body, seq=seq)


def audio(seq: int, event_id: str) -> Record:
    body = AudioBody(pcm=b"\0\0" * 240, sample_rate_hz=24000, source_format="pcm16", duration_ms=10)
    return Record(epoch=0, ts_ms=0, origin="client", body=body, event_id=event_id, seq=seq)


def out(seq: int, server_event_seq: int, event_type: str) -> Record:
    body = OutBody(server_event_seq=server_event_seq, event_type=event_type, payload=b"{}")
    return Record(epoch=0, ts_ms=0, origin="server", body=body, seq=seq)


def matching() -> tuple[Witness, list[Record]]:
    """Three acknowledged appends and two journaled events, seen by the client."""
    records = [
        lease(1, "attach", "a", 1),
        audio(2, "c0-1"),
        out(3, 1, "session.updated"),
        audio(4, "c0-2"),
        lease(5, "takeover", "b", 2),
        audio(6, "c0-3"),
        out(7, 2, "session.updated"),
    ]
    witness = Witness("c0", session_id=SESSION, cursor=2)
    witness.seen = {1: "session.updated", 2: "session.updated"}
    witness.acknowledged = [Op(i, f"c0-{i}", "audio", "{}") for i in (1, 2, 3)]
    return witness, records


def test_a_log_that_holds_everything_is_clean():
    witness, records = matching()
    findings = audit(witness, records)
    assert findings.clean and findings.acknowledged == 3


def test_a_missing_acknowledged_record_is_lost():
    witness, records = matching()
    findings = audit(witness, [r for r in records if r.event_id != "c0-2"])
    assert findings.records_lost == 1 and not findings.clean


def test_a_record_logged_twice_is_duplicated():
    witness, records = matching()
    findings = audit(witness, [*records, audio(8, "c0-1")])
    assert findings.records_duplicated == 1 and not findings.clean


def test_records_out_of_order_are_misplaced():
    witness, records = matching()
    swapped = copy.copy(records)
    swapped[1], swapped[3] = records[3], records[1]
    findings = audit(witness, swapped)
    assert findings.records_misplaced == 2 and findings.records_lost == 0


def test_a_journal_that_differs_from_what_the_client_saw():
    witness, records = matching()
    witness.seen[2] = "response.done"
    assert audit(witness, records).journal_mismatches == 1


def test_a_hole_in_the_journal():
    witness, records = matching()
    findings = audit(witness, [*records, out(8, 4, "session.updated")])
    assert findings.journal_holes == 1


def test_a_conversation_the_fold_does_not_rebuild():
    witness, records = matching()
    witness.items = ["item_never_logged"]
    assert audit(witness, records).fold_mismatches == 1


def test_two_owners_under_one_fence():
    witness, records = matching()
    records[4] = lease(5, "takeover", "b", 1)
    assert audit(witness, records).fence_violations == 1
    records[4] = lease(5, "detach", "a", 1)  # the same owner keeps its fence: fine
    assert audit(witness, records).fence_violations == 0


def test_a_refusal_whose_record_landed_is_reported_not_failed():
    witness, records = matching()
    witness.refused = ["c0-9"]
    findings = audit(witness, [*records, audio(8, "c0-9")])
    assert findings.refused_but_logged == 1 and findings.clean
