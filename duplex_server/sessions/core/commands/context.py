"""What every handler is given besides the state and its event
(``HandlerContext``), and the handler's type: its own module so that the topic
modules and the table in ``__init__`` share it without importing each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.effects import Effects
from duplex_server.sessions.core.model_names import ModelNames
from duplex_server.sessions.core.model_port import ModelPort
from protocol.errors import ProtocolError


@dataclass
class HandlerContext:
    """What a handler may use besides the state and the event: the model's
    facts, and what the runtime prepared for this one event (a commit: the
    transcript recognition heard in the buffer; an append: the session's
    decoder for codecs whose packets depend on the ones before, Opus)."""

    model: ModelPort
    # The names the model answers to (None: its own name, OpenAI's as aliases).
    names: ModelNames | None = None
    transcript: str = ""
    # The part of it the client was told already, as partial deltas (a
    # prefix: the runtime keeps what it told: hearing.Hearing.transcribe).
    transcript_told: str = ""
    # Recognition failed on the buffer: the commit goes ahead without a
    # transcript, and the client is told why first.
    transcription_error: ProtocolError | None = None
    # Stage times of the turn, ms: how long the commit waited for its final
    # transcript, and (server VAD) how much silence ended the speech.
    transcription_ms: float | None = None
    vad_hangover_ms: float | None = None
    decode_stream: Callable[[bytes], bytes] | None = None
    # Why the runtime cannot take more input now (its budget is spent, the
    # model is behind real time): the append is refused with this error.
    input_refused: ProtocolError | None = None
    # A large append's pcm16, decoded by the runtime off the event loop (or
    # why it could not be); None: the handler decodes it.
    decoded: bytes | ProtocolError | None = None

    @property
    def model_names(self) -> ModelNames:
        return self.names or ModelNames.of(self.model.name)


# Each handler takes its own event type; the table is keyed by that type.
Handler = Callable[[Batch, Any, HandlerContext], Effects]
