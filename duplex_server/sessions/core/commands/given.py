"""What a handler is given besides the state and its event, each input only
what it really carries: every handler gets :class:`ModelFacts`; a commit
also gets the :class:`HeardTurn` recognition made of its buffer, and an
append the :class:`PreparedAppend` the runtime worked out for it. Its own
module so that the topic modules and the table in ``__init__`` share these
without importing each other.

These replace one ``HandlerContext`` that carried every field any input
might need: a reader of a handler could not tell which fields it was ever
given, and a test had to know which defaults stood for "not prepared"."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.effects import Effects
from duplex_server.sessions.core.model_names import ModelNames
from duplex_server.sessions.core.model_port import ModelPort
from protocol.errors import ProtocolError


@dataclass(frozen=True)
class ModelFacts:
    """What every handler may know of the model: its port (name,
    capabilities, defaults) and the names it answers to."""

    model: ModelPort
    # The names the model answers to (None: its own name, OpenAI's as aliases).
    names: ModelNames | None = None

    @property
    def model_names(self) -> ModelNames:
        return self.names or ModelNames.of(self.model.name)


@dataclass(frozen=True)
class HeardTurn:
    """What recognition heard in the buffer a commit seals (the runtime
    transcribes it before the commit is stepped: ``runtime/hearing.py``)."""

    text: str = ""
    # Recognition failed: the commit goes ahead without a transcript, and
    # the client is told why first.
    error: ProtocolError | None = None
    # How long the commit waited for it, ms (None: no recogniser).
    wait_ms: float | None = None
    # The start of ``text`` the client was told already as partial deltas.
    told: str = ""


@dataclass(frozen=True)
class PreparedAppend:
    """What the runtime worked out for one append before it is stepped."""

    # The session's decoder for codecs whose packets depend on the ones
    # before (Opus); the runtime keeps it from append to append.
    decode_stream: Callable[[bytes], bytes] | None = None
    # Why the runtime cannot take more input now (its budget is spent, the
    # model is behind real time): the append is refused with this error.
    refused: ProtocolError | None = None
    # A large append's pcm16, decoded off the event loop (or why it could
    # not be); None: the handler decodes it.
    decoded: bytes | ProtocolError | None = None


NOTHING_HEARD = HeardTurn()
NOT_PREPARED = PreparedAppend()

# What the runtime may prepare for a command (``core/pipeline.apply``).
Prepared = HeardTurn | PreparedAppend

# Each handler takes its own event type; the table is keyed by that type.
Handler = Callable[[Batch, Any, ModelFacts], Effects]
