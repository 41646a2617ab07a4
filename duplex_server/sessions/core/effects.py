"""What the runtime must do outside the log once a step's batch landed.

A handler returns these as data, in the order they are performed (a turn's
audio is kept before the answer to it starts; an answer is stopped before
its successor starts), and the actor performs each with one ``match``
ending in ``assert_never``: an effect added here and not performed there
is a type error. They are what the step asks of the model, the journal
and the socket, never records: those are in the batch already.
"""

from __future__ import annotations

from dataclasses import dataclass

from duplex_server.sessions.core.state import Response


@dataclass(frozen=True)
class KeepTurn:
    """A newly committed user turn's audio (pcm16 at the item's own rate,
    ``part.audio_rate``), for the model's cache of recent turns."""

    item_id: str
    pcm: bytes


@dataclass(frozen=True)
class StopAnswer:
    """The response was fenced off (cancel, barge-in, clear, close): its
    stream stops, and what it still produces never reaches the log."""

    response_id: str


@dataclass(frozen=True)
class StartAnswer:
    """The session opened this response: the model is asked for it."""

    response: Response


@dataclass(frozen=True)
class Trim:
    """The client acknowledged every event up to ``upto``: the journal and
    the log's outbound records let go of them (and acknowledged audio may
    be compacted)."""

    upto: int


@dataclass(frozen=True)
class Close:
    """The session closed: the socket drains what was journaled, then closes."""


Effect = KeepTurn | StopAnswer | StartAnswer | Trim | Close
Effects = tuple[Effect, ...]
