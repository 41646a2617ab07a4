"""A session's socket comes and goes: a resume attaches a new one, a detach
lets it go, a suspend sends it away for a restart. Each change is recorded
as the lease's fact (``core/server_inputs.py`` decides which) before the
socket hears of it, and the lease follows: let go on a detach (another
replica may take the session), taken back on a resume.

It works on the session's parts, never the actor (no cycle through it).
"""

from __future__ import annotations

import time

from duplex_server.sessions.core import server_inputs as inputs
from duplex_server.sessions.log.tokens import new_resume_token
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.lease import SessionLease, SessionMoved
from duplex_server.sessions.runtime.lifecycle import Lifecycle, Phase
from duplex_server.sessions.runtime.log_writer import LogWriter
from duplex_server.sessions.runtime.model_feed import ModelFeed
from duplex_server.sessions.runtime.performer import Performer
from duplex_server.sessions.runtime.socket_slot import SocketSlot
from protocol.close_codes import CloseCode
from protocol.errors import ProtocolError


class SocketChanges:
    def __init__(
        self,
        writer: LogWriter,
        socket: SocketSlot,
        feed: ModelFeed,
        lease: SessionLease,
        lifecycle: Lifecycle,
        out: Performer,
    ) -> None:
        self._writer = writer
        self._socket = socket
        self._feed = feed
        self._lease = lease
        self._lifecycle = lifecycle
        self._out = out

    async def resume(self, message: mb.Resume) -> bool:
        """Attach the resuming socket and replay what it missed; False (and
        the resumer told why) when it may not or the log cannot say so."""
        request, state = message.request, self._writer.state
        if not message.may_use(state.owner):
            message.done.set_exception(mb.not_yours(request))
            return False
        if (refused := inputs.resume_refusal(state, request)) is not None:
            message.done.set_exception(refused)
            return False
        try:
            # A detached session's lease was let go; take it back unless
            # another replica took the session meanwhile (it is served there).
            await self._lease.take_back()
        except (SessionMoved, ProtocolError) as exc:
            message.done.set_exception(exc)
            return False
        token = new_resume_token()
        batch = self._writer.new_batch()
        generation = inputs.record_resume(batch, self._lease.holder(), token)
        if not await self._out.commit(batch):
            message.done.set_exception(
                ProtocolError("storage_unavailable", "could not record the resume")
            )
            return False
        await self._socket.replace(generation)
        self._socket.attach(message.attachment, generation)
        self._lifecycle.to(Phase.ATTACHED)
        await self._socket.greet_resumed(token, request.last_received_server_event_seq)
        message.done.set_result(None)
        return True

    async def detach(self, generation: int) -> None:
        """The socket of ``generation`` went away; a superseded one's is no news."""
        if await self._socket.take(generation) is None:
            return
        self._lifecycle.to(Phase.DETACHED, at=time.monotonic())
        batch = self._writer.new_batch()
        inputs.record_detach(batch, self._lease.holder())
        if await self._out.commit(batch):
            await self._lease.release()

    async def suspend(self) -> None:
        """Hand the session over to the next process: detach, tell the client to resume."""
        self._feed.stop_all()
        attachment = await self._socket.take()
        if attachment is not None:
            batch = self._writer.new_batch()
            inputs.record_detach(batch, self._lease.holder())
            await self._out.commit(batch)
            await attachment.close(
                CloseCode.SERVICE_RESTART, "server restarting: resume the session"
            )
        await self._lease.release()
        self._lifecycle.to(Phase.SUSPENDED)
