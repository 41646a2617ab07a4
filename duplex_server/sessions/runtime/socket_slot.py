"""Which socket the session speaks to now, and the socket-scoped words it hears.

A session has at most one attachment at a time (a newer generation replaces
the older). What only one socket hears is sent here, never journaled: its
greeting (``session.created`` / ``session.resumed``), a heartbeat's ack,
``session.replaced`` and an error the log could not hold. The journal's
events reach it through the attachment's sender, from a cursor.
"""

from __future__ import annotations

from duplex_server.sessions.core.snapshot import session_object
from duplex_server.sessions.runtime.attachment import Attachment
from duplex_server.sessions.runtime.journal import Journal
from duplex_server.sessions.runtime.log_writer import LogWriter
from protocol.capabilities import Capabilities
from protocol.close_codes import CloseCode
from protocol.codec import encode_server_event
from protocol.errors import ProtocolError, error_body
from protocol.server_events import (
    Error,
    SessionCreated,
    SessionHeartbeatAck,
    SessionObject,
    SessionReplaced,
    SessionResumed,
    SessionResyncRequired,
)

DRAIN_TIMEOUT_S = 2.0
# Sideband sockets one session may have (a server application watching and
# steering a call): each is a sender draining the journal.
MAX_WATCHERS = 4


class SocketSlot:
    """Greetings and resyncs carry the session object as the writer's state
    has it now (never read through the actor, so that a closed session
    holds no cycle through its sender)."""

    def __init__(
        self, session_id: str, journal: Journal, writer: LogWriter, capabilities: Capabilities
    ) -> None:
        self._session_id = session_id
        self._journal = journal
        self._writer = writer
        self._capabilities = capabilities
        self.current: Attachment | None = None
        self._heartbeats = 0  # acks sent, for their event ids
        # Sideband sockets, by their generations: negative, so never a
        # client socket's (those count up from the lease's).
        self._watchers: dict[int, Attachment] = {}
        self._last_watcher = 0

    def holds(self, generation: int) -> bool:
        """Whether ``generation`` is the socket attached now (not a superseded
        one) or a sideband socket watching the session: a frame from either
        is the session's input."""
        if generation in self._watchers:
            return True
        return self.current is not None and self.current.generation == generation

    def watch(self, attachment: Attachment) -> bool:
        """A sideband socket sees the session's events from now on, beside the
        client's socket (which it never replaces); False when the session has
        ``MAX_WATCHERS`` already."""
        if len(self._watchers) >= MAX_WATCHERS:
            return False
        self._last_watcher -= 1
        attachment.generation = self._last_watcher
        self._watchers[attachment.generation] = attachment
        attachment.start_sender(self._journal, self._journal.last_seq, self.overflow_notice)
        return True

    async def unwatch(self, attachment: Attachment) -> None:
        """The sideband socket went away: its sender stops."""
        if self._watchers.pop(attachment.generation, None) is not None:
            await attachment.stop()

    async def _close_watchers(self, code: CloseCode, reason: str) -> None:
        watchers, self._watchers = list(self._watchers.values()), {}
        for watcher in watchers:
            await watcher.drained(self._journal.last_seq, DRAIN_TIMEOUT_S)
            await watcher.close(code, reason)

    def _snapshot(self) -> SessionObject:
        return session_object(self._writer.state, self._capabilities)

    def _event_id(self, kind: str) -> str:
        return f"event_{self._session_id[-8:]}_{kind}"

    def overflow_notice(self, oldest: int) -> bytes:
        return encode_server_event(
            SessionResyncRequired(
                reason="journal_overflow", session=self._snapshot(), oldest_available_seq=oldest
            )
        )

    def attach(self, attachment: Attachment, generation: int) -> None:
        """``attachment`` is the session's socket now, as ``generation``."""
        attachment.generation = generation
        self.current = attachment

    async def greet_opened(self, token: str | None) -> None:
        """The first socket: ``session.created``, then the journal from its start."""
        attachment = self._attached()
        created = SessionCreated(
            session=self._snapshot(),
            attachment_generation=attachment.generation,
            resume_token=token,
            event_id=self._event_id("c1"),
        )
        await attachment.send_now(encode_server_event(created))
        attachment.start_sender(self._journal, 0, self.overflow_notice)

    async def greet_resumed(self, token: str, cursor: int) -> None:
        """A resuming socket: ``session.resumed``, then what it missed after
        ``cursor``; if the journal let that go, ``session.resync_required``
        (the state now) and the journal from its end."""
        attachment = self._attached()
        journal = self._journal
        resumed = SessionResumed(
            session=self._snapshot(),
            attachment_generation=attachment.generation,
            resume_token=token,
            replay_from_seq=cursor + 1,
            replay_to_seq=journal.last_seq,
            event_id=self._event_id(f"r{attachment.generation}"),
        )
        await attachment.send_now(encode_server_event(resumed))
        if cursor < journal.dropped_upto:
            gap = SessionResyncRequired(
                reason="journal_gap",
                session=self._snapshot(),
                oldest_available_seq=journal.dropped_upto + 1,
            )
            await attachment.send_now(encode_server_event(gap))
            cursor = journal.last_seq
        attachment.start_sender(journal, cursor, self.overflow_notice)

    def _attached(self) -> Attachment:
        if self.current is None:
            raise RuntimeError("no socket is attached to greet")
        return self.current

    def answer_heartbeat(self, generation: int, epoch: int) -> bool:
        """Ack a heartbeat after every event journaled before it (those were
        sent before it); False for a superseded socket's late frame."""
        if self.current is None or not self.holds(generation):
            return False
        self._heartbeats += 1
        ack = SessionHeartbeatAck(
            event_id=self._event_id(f"h{generation}_{self._heartbeats}"),
            epoch=epoch,
            session_id=self._session_id,
        )
        self.current.send_after(self._journal.last_seq, [encode_server_event(ack)])
        return True

    async def send_error_now(self, err: ProtocolError) -> None:
        """An error that could not be journaled (the log is down)."""
        if self.current is not None:
            await self.current.send_now(encode_server_event(Error(error=error_body(err))))

    async def take(self, generation: int | None = None) -> Attachment | None:
        """Let the socket go (of ``generation`` only, when given): its sender
        stops; the caller closes it or forgets it."""
        attachment = self.current
        if attachment is None or (generation is not None and attachment.generation != generation):
            return None
        self.current = None
        await attachment.stop()
        return attachment

    async def replace(self, new_generation: int) -> None:
        """A newer socket takes the session: the old one is told and closed."""
        old = await self.take()
        if old is not None:
            await old.send_now(
                encode_server_event(SessionReplaced(attachment_generation=new_generation))
            )
            await old.close(CloseCode.REPLACED, "session.replaced")

    async def move_away(self) -> None:
        """Another replica serves the session now: the socket is told to go there."""
        attachment = await self.take()
        if attachment is not None:
            await attachment.send_now(
                encode_server_event(SessionReplaced(attachment_generation=attachment.generation))
            )
            await attachment.close(CloseCode.MOVED, "session.replaced")
        await self._close_watchers(CloseCode.MOVED, "session.replaced")

    async def close_after_drain(self, reason: str) -> None:
        """The session closed: what was journaled goes out first (for a while),
        to the client's socket and to every sideband socket."""
        attachment = self.current
        if attachment is not None:
            await attachment.drained(self._journal.last_seq, DRAIN_TIMEOUT_S)
            self.current = None
            await attachment.close(CloseCode.NORMAL, reason)
        await self._close_watchers(CloseCode.NORMAL, reason)

    async def fail(self) -> None:
        """The actor failed: the client is not left talking to nobody."""
        if self.current is not None:
            await self.current.close(CloseCode.INTERNAL_ERROR, "internal error")
        await self._close_watchers(CloseCode.INTERNAL_ERROR, "internal error")
