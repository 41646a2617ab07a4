"""What the runtime works out before an admitted command is stepped.

The step is pure; some inputs need I/O or time first. A commit (the
client's, or the end of a turn server VAD heard) needs the transcript of the
buffer it seals; an append needs the session's input budget and the model's
backlog (either may refuse it), and a large one is decoded on a worker
thread so one client's big chunk never holds the event loop. Once the
append landed, its media is charged against the budget here too.
"""

from __future__ import annotations

import asyncio
import time

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import (
    Prepared,
    PreparedAppend,
    append_format,
    decode_append,
)
from duplex_server.sessions.core.heard import TurnEnded
from duplex_server.sessions.core.pipeline import Command
from duplex_server.sessions.core.records import AudioBody
from duplex_server.sessions.core.state import SessionState
from duplex_server.sessions.runtime.codecs import SessionCodecs
from duplex_server.sessions.runtime.hearing import Hearing
from duplex_server.sessions.runtime.input_budget import InputBudget
from duplex_server.sessions.runtime.model_feed import ModelFeed
from duplex_server.sessions.runtime.recovery import media_bytes
from protocol.client_events import InputAudioAppend, InputAudioCommit
from protocol.errors import ProtocolError

# Appends larger than this (base64 characters: ~190 KB of samples, 4 s of
# 24 kHz pcm16) are decoded on a worker thread instead of the event loop.
OFFLOAD_DECODE_CHARS = 256 * 1024


class InputPreparation:
    def __init__(
        self, hearing: Hearing, budget: InputBudget, codecs: SessionCodecs, feed: ModelFeed
    ) -> None:
        self._hearing = hearing
        self._budget = budget
        self._codecs = codecs
        self._feed = feed

    async def prepare(self, state: SessionState, command: Command) -> Prepared | None:
        """What recognition heard in the buffer a commit seals; for an append,
        why it cannot be taken now, its pcm16 when decoded off the loop, and
        the session's Opus decoder; None for a command that needs nothing."""
        if isinstance(command, InputAudioCommit | TurnEnded):
            speech_end = command.at_ms if isinstance(command, TurnEnded) else None
            return await self._hearing.transcribe(state, speech_end)
        if isinstance(command, InputAudioAppend):
            refused = self._budget.refusal(time.monotonic())
            if refused is None and self._feed.full:
                refused = ProtocolError(
                    "rate_limited", "the model is behind real time on this session's audio"
                )
            decoded = None
            if refused is None and len(command.audio) > OFFLOAD_DECODE_CHARS:
                decoded = await self._decode_off_loop(state, command)
            return PreparedAppend(self._codecs.decode_opus, refused, decoded)
        return None

    async def _decode_off_loop(
        self, state: SessionState, event: InputAudioAppend
    ) -> bytes | ProtocolError | None:
        """Decode (and for Opus, run the session's decoder over) a large
        append on a worker thread; the actor waits, other sessions run. None
        when the append is refused before decoding (the handler says why)."""
        try:
            fmt = append_format(state, event)
        except ProtocolError:
            return None
        try:
            return await asyncio.to_thread(decode_append, event, fmt, self._codecs.decode_opus)
        except ProtocolError as err:
            return err

    def charge(self, batch: Batch) -> None:
        """The landed append's media, against the session's input budget."""
        media_ms = sum(r.body.duration_ms for r in batch.records if isinstance(r.body, AudioBody))
        self._budget.charge(media_ms, media_bytes(batch.records), time.monotonic())
