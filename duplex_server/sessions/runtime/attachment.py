"""The socket as the session core sees it, and the task that feeds it.

An attachment is one connected client socket. Its sender drains the journal
from a cursor, so a slow socket delays only itself, never the actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from duplex_server.sessions.runtime.journal import Journal, JournalGap
from protocol.close_codes import CloseCode
from protocol.dialect import Dialect, present

log = logging.getLogger(__name__)


MAX_PENDING_REPLIES = 256


class Transport(Protocol):
    async def send(self, payload: bytes) -> None: ...

    async def close(self, code: CloseCode, reason: str) -> None: ...


class TransportClosed(Exception):
    """The peer is gone; raised by :meth:`Transport.send`."""


class Attachment:
    """``dialect``: which spelling of OpenAI's events this socket gets; the
    journal holds them all and the sender projects (protocol.dialect)."""

    def __init__(
        self, transport: Transport, generation: int = 0, dialect: Dialect = Dialect.GA
    ) -> None:
        self.transport = transport
        self.generation = generation
        self.dialect = dialect
        self.cursor = 0
        self._sender: asyncio.Task[None] | None = None
        self._journal: Journal | None = None
        # Attachment-scoped answers (heartbeat acks), each due once the
        # journal up to its seq went out: (seq, payload). Bounded: a socket
        # that heartbeats without reading loses its oldest unsent acks.
        self._replies: deque[tuple[int, bytes]] = deque(maxlen=MAX_PENDING_REPLIES)

    async def send_now(self, payload: bytes) -> bool:
        """Send an attachment-scoped event (not journaled); False if the peer is gone."""
        shown = present(payload, self.dialect)
        if shown is None:
            return True
        try:
            await self.transport.send(shown)
        except TransportClosed:
            return False
        return True

    def start_sender(
        self, journal: Journal, cursor: int, on_overflow: Callable[[int], bytes]
    ) -> None:
        """Drain ``journal`` after ``cursor``; ``on_overflow(oldest)`` builds the
        ``session.resync_required`` sent if this socket falls out of the window."""
        self.cursor = cursor
        self._journal = journal
        self._sender = asyncio.get_running_loop().create_task(self._drain(journal, on_overflow))

    def send_after(self, seq: int, payloads: list[bytes]) -> None:
        """Answer this socket alone, in order: after every journaled event up
        to ``seq``, never journaled, so never replayed to another socket
        (PROTOCOL.md: attachment-scoped events)."""
        self._replies.extend((seq, payload) for payload in payloads)
        if self._journal is not None:
            self._journal.poke()

    def _replies_due(self) -> bool:
        return bool(self._replies) and self._replies[0][0] <= self.cursor

    async def _drain(self, journal: Journal, on_overflow: Callable[[int], bytes]) -> None:
        while True:
            while journal.last_seq <= self.cursor and not self._replies_due():
                await journal.changed()
            if not await self._send_replies():
                return
            try:
                entries = journal.since(self.cursor)
            except JournalGap as gap:
                # The window moved past this slow socket: it cannot be caught up
                # event by event; it gets the current state and goes on from there.
                log.warning("sender for generation %s fell behind: %s", self.generation, gap)
                try:
                    await self.transport.send(on_overflow(gap.oldest))
                except TransportClosed:
                    return
                self.cursor = journal.last_seq
                continue
            for seq, payload in entries:
                shown = present(payload, self.dialect)
                if shown is not None:
                    try:
                        await self.transport.send(shown)
                    except TransportClosed:
                        return
                self.cursor = seq
            if not await self._send_replies():
                return

    async def _send_replies(self) -> bool:
        """Send the answers now due; False once the peer is gone."""
        while self._replies_due():
            _, payload = self._replies.popleft()
            if not await self.send_now(payload):
                return False
        return True

    async def drained(self, seq: int, timeout_s: float) -> None:
        """Wait until everything up to ``seq`` went out (or the peer is gone)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.cursor < seq and self._sender is not None and not self._sender.done():
            if loop.time() > deadline:
                return
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None

    async def close(self, code: CloseCode = CloseCode.NORMAL, reason: str = "") -> None:
        await self.stop()
        with contextlib.suppress(TransportClosed):
            await self.transport.close(code, reason)
