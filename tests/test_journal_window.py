"""The journal window senders drain (runtime.journal.Journal).

Bounded by count and by bytes, trimmed by acknowledgement, refilled from the
log; a cursor older than the window is a gap. No socket and no clock: the
waits below are bounded only as a guard against a hang.
"""

from __future__ import annotations

import asyncio

import pytest

from duplex_server.sessions.runtime.journal import Journal, JournalGap

HANG_GUARD_S = 10.0


def entries(first: int, last: int, size: int = 4) -> list[tuple[int, bytes]]:
    """Outbound events ``first..last`` with ``size``-byte payloads naming their seq."""
    return [(seq, f"{seq:0{size}d}".encode()[-size:]) for seq in range(first, last + 1)]


def seqs(window: list[tuple[int, bytes]]) -> list[int]:
    return [seq for seq, _ in window]


def test_a_fresh_journal_is_empty_at_its_last_seq():
    journal = Journal(max_events=8, last_seq=5)
    assert (journal.last_seq, journal.dropped_upto, journal.bytes) == (5, 5, 0)
    assert journal.since(5) == []
    assert journal.since(9) == []
    with pytest.raises(JournalGap) as gap:
        journal.since(4)
    assert (gap.value.cursor, gap.value.oldest) == (4, 6)


def test_add_appends_in_order_and_counts_bytes():
    journal = Journal(max_events=8)
    assert journal.add([]) is None
    assert journal.last_seq == 0
    assert journal.add(entries(1, 3)) is None  # nothing evicted
    assert journal.add(entries(4, 5)) is None
    assert journal.last_seq == 5
    assert journal.bytes == 5 * 4
    assert journal.since(0) == entries(1, 5)


def test_since_returns_only_entries_after_the_cursor_in_order():
    journal = Journal(max_events=16)
    journal.add(entries(1, 10))
    assert seqs(journal.since(0)) == list(range(1, 11))
    assert seqs(journal.since(6)) == [7, 8, 9, 10]
    assert journal.since(9) == [(10, b"0010")]
    assert journal.since(10) == []
    assert journal.since(42) == []  # a cursor ahead of the journal has nothing to read


def test_the_event_bound_evicts_the_oldest_and_reports_the_new_dropped_upto():
    journal = Journal(max_events=4)
    journal.add(entries(1, 3))
    assert journal.add(entries(4, 6)) == 2  # 1 and 2 left to keep four
    assert journal.dropped_upto == 2
    assert seqs(journal.since(2)) == [3, 4, 5, 6]
    assert journal.bytes == 4 * 4
    with pytest.raises(JournalGap) as gap:
        journal.since(1)
    assert (gap.value.cursor, gap.value.oldest) == (1, 3)


def test_one_add_larger_than_the_window_keeps_only_its_tail():
    journal = Journal(max_events=3)
    assert journal.add(entries(1, 10)) == 7
    assert seqs(journal.since(7)) == [8, 9, 10]
    assert journal.last_seq == 10


def test_the_byte_bound_evicts_the_oldest_until_the_window_fits():
    journal = Journal(max_events=100, max_bytes=10)
    assert journal.add(entries(1, 2)) is None  # 8 bytes
    assert journal.add(entries(3, 3)) == 1  # 12 > 10: seq 1 goes
    assert (journal.bytes, journal.dropped_upto) == (8, 1)
    assert seqs(journal.since(1)) == [2, 3]
    with pytest.raises(JournalGap) as gap:
        journal.since(0)
    assert gap.value.oldest == 2


def test_the_byte_bound_keeps_the_newest_entry_even_when_it_alone_is_too_big():
    journal = Journal(max_events=100, max_bytes=10)
    journal.add(entries(1, 2))
    big = (3, b"x" * 64)
    assert journal.add([big]) == 2
    assert journal.since(2) == [big]
    assert journal.bytes == 64
    assert journal.dropped_upto == 2


def test_trim_drops_acknowledged_entries():
    journal = Journal(max_events=16)
    journal.add(entries(1, 6))
    journal.trim(3)
    assert journal.dropped_upto == 3
    assert journal.bytes == 3 * 4
    assert seqs(journal.since(3)) == [4, 5, 6]
    with pytest.raises(JournalGap) as gap:
        journal.since(2)
    assert gap.value.oldest == 4


def test_a_stale_acknowledgement_moves_nothing_back():
    journal = Journal(max_events=16)
    journal.add(entries(1, 6))
    journal.trim(4)
    journal.trim(2)
    assert journal.dropped_upto == 4
    assert seqs(journal.since(4)) == [5, 6]


def test_an_acknowledgement_beyond_the_last_seq_empties_but_does_not_overshoot():
    journal = Journal(max_events=16)
    journal.add(entries(1, 3))
    journal.trim(99)
    assert (journal.dropped_upto, journal.bytes) == (3, 0)
    assert journal.since(3) == []
    journal.add(entries(4, 5))  # the next events are readable from the acked cursor
    assert seqs(journal.since(3)) == [4, 5]


def test_restore_refills_the_window_from_log_entries():
    journal = Journal(max_events=16)
    journal.add(entries(1, 2))
    journal.restore(entries(5, 9), last_seq=9)
    assert journal.last_seq == 9
    assert journal.dropped_upto == 4  # everything before the first restored entry
    assert journal.bytes == 5 * 4
    assert journal.since(4) == entries(5, 9)
    with pytest.raises(JournalGap) as gap:
        journal.since(3)
    assert gap.value.oldest == 5


def test_restore_keeps_only_the_newest_max_events():
    journal = Journal(max_events=3)
    journal.restore(entries(1, 10), last_seq=10)
    assert journal.dropped_upto == 7
    assert seqs(journal.since(7)) == [8, 9, 10]
    assert journal.bytes == 3 * 4


def test_restore_with_nothing_journaled_is_empty_at_the_last_seq():
    journal = Journal(max_events=8)
    journal.add(entries(1, 3))
    journal.restore([], last_seq=12)
    assert (journal.last_seq, journal.dropped_upto, journal.bytes) == (12, 12, 0)
    assert journal.since(12) == []
    with pytest.raises(JournalGap):
        journal.since(11)


async def test_wait_beyond_returns_at_once_when_the_journal_is_already_past_the_cursor():
    journal = Journal(max_events=8)
    journal.add(entries(1, 3))
    await asyncio.wait_for(journal.wait_beyond(2), HANG_GUARD_S)


async def test_wait_beyond_wakes_when_an_entry_after_the_cursor_is_added():
    journal = Journal(max_events=8)
    journal.add(entries(1, 2))
    waiter = asyncio.ensure_future(journal.wait_beyond(3))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()  # nothing after 3 yet

    journal.add(entries(3, 3))  # a change, but still not beyond the cursor
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()

    journal.add(entries(4, 4))
    await asyncio.wait_for(waiter, HANG_GUARD_S)
    assert seqs(journal.since(3)) == [4]


async def test_wait_beyond_wakes_every_waiter():
    journal = Journal(max_events=8)
    waiters = [asyncio.ensure_future(journal.wait_beyond(0)) for _ in range(3)]
    await asyncio.sleep(0)
    journal.add(entries(1, 1))
    await asyncio.wait_for(asyncio.gather(*waiters), HANG_GUARD_S)


async def test_wait_beyond_wakes_on_restore():
    journal = Journal(max_events=8)
    waiter = asyncio.ensure_future(journal.wait_beyond(0))
    await asyncio.sleep(0)
    journal.restore(entries(1, 2), last_seq=2)
    await asyncio.wait_for(waiter, HANG_GUARD_S)


def test_restore_keeps_the_byte_bound_too():
    journal = Journal(max_events=100, max_bytes=10)
    journal.restore([(seq, b"abcd") for seq in range(1, 11)], last_seq=10)
    assert journal.bytes <= 10 and [seq for seq, _ in journal.since(journal.dropped_upto)] == [
        9,
        10,
    ]
    assert journal.dropped_upto == 8


async def test_heartbeat_acks_go_out_after_the_journal_before_them_and_are_bounded():
    """Attachment-scoped answers wait for the journaled events before them,
    and a socket that never drains keeps only the newest of them."""
    from duplex_server.sessions.runtime.attachment import MAX_PENDING_REPLIES, Attachment

    sent: list[bytes] = []
    unblock = asyncio.Event()

    class Transport:
        async def send(self, payload: bytes) -> None:
            await unblock.wait()
            sent.append(payload)

        async def close(self, code, reason) -> None:
            pass

    journal = Journal(max_events=100)
    attachment = Attachment(Transport())
    attachment.start_sender(journal, 0, lambda oldest: b"{}")
    journal.add([(1, b'{"type":"a"}')])
    attachment.send_after(1, [b'{"type":"session.heartbeat_ack"}'])
    for n in range(MAX_PENDING_REPLIES + 10):
        attachment.send_after(1, [b'{"type":"session.heartbeat_ack","n":%d}' % n])
    unblock.set()
    for _ in range(1000):
        if len(sent) == 1 + MAX_PENDING_REPLIES:
            break
        await asyncio.sleep(0)
    await attachment.stop()
    assert sent[0] == b'{"type":"a"}'  # the journaled event first
    assert len(sent) == 1 + MAX_PENDING_REPLIES  # the oldest unsent acks were dropped
    assert sent[-1].endswith(b'"n":%d}' % (MAX_PENDING_REPLIES + 9))
