"""The window of journaled outbound events that senders drain.

The log is the truth; this is its recent tail kept in memory so that a
socket's sender never reads the backend on the hot path. It is bounded:
an entry leaves when the client acknowledged it or when the window is full,
and a cursor older than the window is a gap (``session.resync_required``).
"""

from __future__ import annotations

import asyncio
from collections import deque

DEFAULT_MAX_EVENTS = 4096
# About a minute of 24 kHz answer audio in both spellings: more than the
# disconnect grace, and what a session holds when its client never acks.
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


class JournalGap(Exception):
    def __init__(self, cursor: int, oldest: int) -> None:
        super().__init__(f"cursor {cursor} is older than the journal (oldest {oldest})")
        self.cursor = cursor
        self.oldest = oldest


class Journal:
    def __init__(self, max_events: int, last_seq: int = 0, max_bytes: int = 1 << 62) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: deque[tuple[int, bytes]] = deque()
        self.last_seq = last_seq
        self.dropped_upto = last_seq  # every seq <= this is gone from the window
        self._changed = asyncio.Event()

    def add(self, entries: list[tuple[int, bytes]]) -> int | None:
        """Append; returns the new ``dropped_upto`` if the bound evicted entries."""
        if not entries:
            return None
        self._entries.extend(entries)
        self.bytes += sum(len(payload) for _, payload in entries)
        self.last_seq = entries[-1][0]
        evicted = None
        while len(self._entries) > self.max_events or (
            self.bytes > self.max_bytes and len(self._entries) > 1
        ):
            evicted, payload = self._entries.popleft()
            self.bytes -= len(payload)
        if evicted is not None:
            self.dropped_upto = evicted
        self._wake()
        return evicted

    def restore(self, entries: list[tuple[int, bytes]], last_seq: int) -> None:
        """Refill the window from the log (after a restart, or a refold), to
        the same bounds as ``add`` keeps (the newest entry always stays)."""
        self._entries = deque(entries[-self.max_events :])
        self.bytes = sum(len(payload) for _, payload in self._entries)
        while self.bytes > self.max_bytes and len(self._entries) > 1:
            self.bytes -= len(self._entries.popleft()[1])
        self.last_seq = last_seq
        self.dropped_upto = self._entries[0][0] - 1 if self._entries else last_seq
        self._wake()

    def trim(self, upto: int) -> None:
        while self._entries and self._entries[0][0] <= upto:
            self.bytes -= len(self._entries.popleft()[1])
        self.dropped_upto = max(self.dropped_upto, min(upto, self.last_seq))

    def since(self, cursor: int) -> list[tuple[int, bytes]]:
        if cursor < self.dropped_upto:
            raise JournalGap(cursor, self.dropped_upto + 1)
        newer: list[tuple[int, bytes]] = []
        for entry in reversed(self._entries):  # senders ask for the recent tail
            if entry[0] <= cursor:
                break
            newer.append(entry)
        newer.reverse()
        return newer

    async def wait_beyond(self, cursor: int) -> None:
        while self.last_seq <= cursor:
            await self.changed()

    async def changed(self) -> None:
        """Until the next ``add`` or ``poke``."""
        changed = self._changed
        await changed.wait()

    def poke(self) -> None:
        """Wake the waiters without adding: something beside the journal is due."""
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
