"""A session's feed into a native duplex model, unit by unit, off the actor.

One of the two kinds of :class:`~duplex_server.sessions.runtime.model_feed.ModelFeed`
(the other is ``turn_feed``). The actor hands over each appended chunk
(pcm16 at the client's rate); this resamples it to the model's rate
through one stream resampler (no seams between chunks), cuts
it into units (core.units) and steps the model on them strictly in order on
a task of its own, so a slow step delays this session's model, never the
actor. What the model decided comes back through the mailbox as
:class:`~duplex_server.sessions.runtime.mailbox.UnitOutputs` tagged with the
epoch it was stepped under, so the actor drops output of an answer that was
fenced meanwhile.

A primed model (``primes_at_input``: Moshi, with its persona and voice
prompt) is opened at the session's first input audio, with the session's
setup as it stands then, or at once for a session restored with input
already in its log; other models open when the session starts. Until the
model is open, nothing is clocked.

While the client sends nothing, the clock keeps time: after a unit's worth
of quiet (and a little slack for network jitter) it feeds a silence unit,
and one per unit after that, so the model hears the pause as it happens;
the resampler's held-back tail goes ahead of it, and the next speech starts
a fresh stream (as does a change of the client's rate).

Each stepped unit goes back to the actor with the tokens the model
generated from it, to be logged as a ``unit`` record; a session restored
from its log hands its latest such records to the model when it opens its
stream (``restore``), so the model continues where the log left off.
Input that was logged as ``audio`` but not yet stepped when the process
died is not stepped after the restore: the model's timeline continues from
its last logged unit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from duplex_server.audio import StreamResampler
from duplex_server.sessions.core.model_port import (
    InputUnit,
    ResponseRequest,
    SteppedUnit,
    Streaming,
    StreamSetup,
    UnitOutput,
    UnitSession,
)
from duplex_server.sessions.core.records import UnitBody
from duplex_server.sessions.core.units import UnitFramer
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.output_pieces import bounded

log = logging.getLogger(__name__)

# Units waiting for the model: beyond this the model is not keeping up with
# real time and appends are refused (rate_limited) instead of queueing.
MAX_QUEUED_UNITS = 64
# A pause is clocked once the client has been quiet this many units.
QUIET_UNITS = 1.5


class UnitFeed:
    def __init__(
        self,
        model: Streaming,
        session_id: str,
        post: Callable[[mb.ModelMessage], None],
        epoch: Callable[[], int],
        setup: Callable[[], StreamSetup | None] = StreamSetup,
    ) -> None:
        """``setup`` reads the session's setup (None while it has no input)."""
        self._model = model
        self._setup = setup
        self._session_id = session_id
        self._session: UnitSession | None = None  # opened when the actor starts serving
        self._framer = UnitFramer(model.sample_rate_hz, model.unit_ms)
        self._resampler: StreamResampler | None = None  # made for the client's rate
        self._unit_s = model.unit_ms / 1000
        self._post = post
        self._epoch = epoch
        self._queue: asyncio.Queue[InputUnit] = asyncio.Queue()
        self._last_input = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._failed = False  # the model raised: nothing is stepped any more
        self._history: list[SteppedUnit] = []  # a restored session's latest units

    def restore(self, units: list[UnitBody]) -> None:
        """Keep the latest ``resume_units`` logged units for the model's
        rebuild; new units continue their numbering."""
        keep = self._model.resume_units
        latest = units[-keep:] if keep else []
        self._history = [self._stepped(body) for body in latest]
        if units:
            self._framer.next_index = units[-1].index + 1

    def _stepped(self, body: UnitBody) -> SteppedUnit:
        pcm = bytes(self._framer.unit_bytes) if body.silence else body.pcm
        unit = InputUnit(
            index=body.index,
            pcm=pcm,
            sample_rate_hz=self._framer.sample_rate_hz,
            silence=body.silence,
        )
        return SteppedUnit(unit=unit, tokens=tuple(body.tokens))

    def start(self) -> None:
        setup = self._setup()
        if self._model.primes_at_input and setup is None:
            return  # opened by the session's first input audio
        self._open(setup or StreamSetup())

    def _open(self, setup: StreamSetup) -> None:
        history, self._history = self._history, []
        session = self._session = self._model.open(self._session_id, setup, history)
        loop = asyncio.get_running_loop()
        self._last_input = loop.time()
        self._tasks = [loop.create_task(self._step_units(session)), loop.create_task(self._clock())]

    @property
    def full(self) -> bool:
        return self._queue.qsize() >= MAX_QUEUED_UNITS

    def feed(self, pcm16: bytes, sample_rate_hz: int) -> None:
        """Audio the session just logged, at the client's rate."""
        if self._failed:
            return
        if self._session is None:
            self._open(self._setup() or StreamSetup())
        self._last_input = asyncio.get_running_loop().time()
        if self._resampler is None or self._resampler.src_hz != sample_rate_hz:
            tail = self._resampler.flush() if self._resampler is not None else b""
            self._resampler = StreamResampler(sample_rate_hz, self._framer.sample_rate_hz)
            self._frame(tail)
        self._frame(self._resampler.push(pcm16))

    def _frame(self, pcm16: bytes) -> None:
        for unit in self._framer.push(pcm16):
            self._queue.put_nowait(unit)

    def keep_turn(self, item_id: str, pcm16: bytes) -> None:
        """The model heard the turn unit by unit: nothing to keep."""

    def answer(self, request: ResponseRequest) -> None:
        """A response the session opened (``response.create``): the model
        speaks on its own schedule, so it completes empty."""
        self._post(mb.StreamEnd(request.response_id, request.epoch, None))

    def take(self, response_id: str) -> list[UnitOutput]:
        return []  # its output comes as UnitOutputs, never for a requested response

    def forget(self, response_id: str) -> None:
        pass

    def stop(self, response_id: str) -> None:
        """Whatever the model was saying is over; it listens again."""
        if self._session is not None:
            self._session.interrupt()

    def stop_all(self) -> None:
        self.stop("")

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            self._session.close()

    async def _step_units(self, session: UnitSession) -> None:
        while True:
            unit = await self._queue.get()
            epoch = self._epoch()
            try:
                outputs = await session.step(unit)
            except Exception as exc:  # noqa: BLE001 - told to the session, logged in full
                # A model bug ends the model's part in this session, loudly; the
                # session itself (its log, its socket) carries on.
                log.exception("model step failed in session %s", self._session_id)
                self._failed = True
                self._post(mb.ModelFailed(f"{type(exc).__name__}: {exc}", epoch))
                return
            stepped = _unit_record(unit, outputs)
            if outputs or stepped is not None:
                pieces = [piece for output in outputs for piece in bounded(output)]
                self._post(mb.UnitOutputs(outputs=pieces, epoch=epoch, unit=stepped))

    async def _clock(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._failed:
            await asyncio.sleep(self._unit_s)
            quiet = loop.time() - self._last_input
            if quiet >= self._unit_s * QUIET_UNITS and self._queue.empty():
                if self._resampler is not None:
                    self._frame(self._resampler.flush())
                self._queue.put_nowait(self._framer.silence())
                self._last_input = loop.time() - self._unit_s * (QUIET_UNITS - 1)


def _unit_record(unit: InputUnit, outputs: list[UnitOutput]) -> UnitBody | None:
    """The unit and the model's tokens for it, if the model gave any."""
    tokens = next((output.tokens for output in outputs if output.tokens is not None), None)
    if tokens is None:
        return None
    pcm = b"" if unit.silence else unit.pcm
    return UnitBody(index=unit.index, tokens=list(tokens), pcm=pcm, silence=unit.silence)
