"""A step's outcome, carried out: its batch appended, then its effects done.

The actor decides which input is stepped and in what order; the performer
does what a step asks of the world outside the core. It appends the batch
through the log writer and handles a refusal the way the session must (a
duplicate is answered, a deposed lease is left, an outage stops the answer
whose output cannot be recorded); then it performs the step's typed effects
(``core/effects.py``) with one ``match``. It holds the session's parts (the
writer, the socket, the model's feed, the lease), never the actor, so a
closed session is freed by reference counting at once.
"""

from __future__ import annotations

from typing import assert_never

from duplex_server.sessions.core import effects as fx
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.model_output import answer_request
from duplex_server.sessions.core.server_inputs import record_outage_stop
from duplex_server.sessions.log.store import LeaseStatus
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.lease import SessionLease
from duplex_server.sessions.runtime.lifecycle import Lifecycle, Phase
from duplex_server.sessions.runtime.log_writer import Deposed, Duplicate, LogWriter, StoreDown
from duplex_server.sessions.runtime.model_feed import ModelFeed
from duplex_server.sessions.runtime.socket_slot import SocketSlot
from protocol.errors import ProtocolError, error_body
from protocol.server_events import Error


class Performer:
    def __init__(
        self,
        writer: LogWriter,
        socket: SocketSlot,
        feed: ModelFeed,
        lease: SessionLease,
        lifecycle: Lifecycle,
    ) -> None:
        self._writer = writer
        self._socket = socket
        self._feed = feed
        self._lease = lease
        self._lifecycle = lifecycle

    async def commit(self, batch: Batch) -> bool:
        """Append the batch; False when the store refused it, after doing
        what the refusal asks of the session."""
        refusal = await self._writer.commit(batch)
        match refusal:
            case None:
                return True
            case Duplicate(error):
                await self.reject(error)
            case Deposed():
                await self.leave("lost")
            case StoreDown(error):
                # A response whose output cannot be recorded must not carry
                # on with a hole in it: its stream stops here.
                self._feed.stop_all()
                await self._socket.send_error_now(error)
            case _:
                assert_never(refusal)
        return False

    async def reject(self, err: ProtocolError) -> None:
        """Journal an error event for a rejected input; the session keeps serving."""
        err.forget_traceback()
        batch = self._writer.new_batch()
        # Its records do not carry the refused event's id (a retry must not be
        # taken for a duplicate), but a store failure must still name it.
        batch.answers = err.event_id
        batch.emit(Error(error=error_body(err)))
        await self.commit(batch)

    async def perform(self, effects: fx.Effects) -> None:
        """Do what a landed step asks outside the log, in the order it asks."""
        for effect in effects:
            match effect:
                case fx.KeepTurn(item_id, pcm):
                    self._feed.keep_turn(item_id, pcm)
                case fx.StopAnswer(response_id):
                    self._feed.stop(response_id)
                case fx.StartAnswer(response):
                    self._feed.answer(answer_request(self._writer.state, response))
                case fx.Trim(upto):
                    await self._writer.trim(upto)
                case fx.Close():
                    await self.finish_close()
                case _:
                    assert_never(effect)

    async def heal(self) -> bool:
        """Refold from the log once the store answers again; ends as failed
        the response whose stream a storage failure stopped."""
        if not await self._writer.heal():
            return False
        if self._writer.state.closed_reason is not None:
            # The closing batch landed though its append failed (a timeout
            # lost the reply): once the journal's close went out, so does the socket.
            await self.finish_close()
            return True
        batch = self._writer.new_batch()
        record_outage_stop(batch)
        await self.commit(batch)
        return not self._writer.dirty

    async def refuse_unrecorded(self, message: mb.NeedsLog) -> None:
        """Answer what cannot be recorded while the store is down; nothing is
        applied. What needs no answer (engine output, a partial transcript)
        is dropped: the heal that follows the outage stops its response."""
        reason = "the session log is unavailable; retry"
        match message:
            case mb.Client():
                await self._socket.send_error_now(
                    ProtocolError("storage_unavailable", reason, event_id=message.event.event_id)
                )
            case mb.Reject() if self._socket.holds(message.generation):
                # Why its frame was refused, unjournaled.
                await self._socket.send_error_now(message.error)
            case mb.Reject():
                pass  # a superseded socket's frame
            case mb.Resume():
                message.done.set_exception(ProtocolError("storage_unavailable", reason))
            case mb.Chunks() | mb.StreamEnd() | mb.UnitOutputs() | mb.ModelFailed():
                pass
            case mb.Partial() | mb.OverlapHeard():
                pass
            case _:
                assert_never(message)

    async def leave(self, status: LeaseStatus) -> None:
        """The lease is another replica's now (``lost``) or is asked for
        (``handoff``): stop writing, tell the socket, let the lease go."""
        if not self._lifecycle.serving:
            return
        self._feed.stop_all()
        await self._socket.move_away()
        if status == "handoff":
            await self._lease.release()
        self._lifecycle.to(Phase.MOVED)

    async def finish_close(self) -> None:
        """The close is in the log: the socket drains the journal, then closes."""
        if self._lifecycle.serving:
            self._lifecycle.to(Phase.CLOSED)
        await self._socket.close_after_drain(self._writer.state.closed_reason or "closed")
