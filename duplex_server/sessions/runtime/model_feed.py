"""The one thing a session actor drives, whatever kind of model is behind it.

A model takes input one of two ways (``core/model_port.py``): unit by unit
(``Streaming``: native duplex models) or turn by turn (``Answering``: echo,
cascade, the LLM responders). Each gets a feed with this one interface, so
the actor has a single path: it hands over every chunk it logged, every
turn it committed and every response it opened; the model's output comes
back through the mailbox as :class:`~duplex_server.core.model_port.UnitOutput`
and goes through one projection onto the wire and into the log
(``core.responses.project_unit_outputs``) under the epoch fence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from duplex_server.sessions.core.model_port import (
    ModelPort,
    ResponseRequest,
    StreamSetup,
    UnitOutput,
)
from duplex_server.sessions.core.records import UnitBody
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.turn_feed import TurnFeed
from duplex_server.sessions.runtime.unit_feed import UnitFeed


class ModelFeed(Protocol):
    @property
    def full(self) -> bool:
        """The model is behind real time on this session's input: the actor
        refuses more audio (``rate_limited``) rather than queue it."""
        ...

    def start(self) -> None:
        """Begin serving, on the actor's loop."""
        ...

    def feed(self, pcm16: bytes, sample_rate_hz: int) -> None:
        """Audio the session just logged, at the client's rate."""
        ...

    def keep_turn(self, item_id: str, pcm16: bytes) -> None:
        """A committed user turn's audio (at the item's rate), for answers."""
        ...

    def restore(self, units: list[UnitBody]) -> None:
        """Before ``start`` of a session rebuilt from its log: the units its
        model stepped (``unit`` records, oldest first), to rebuild the
        model's state from."""
        ...

    def answer(self, request: ResponseRequest) -> None:
        """The session opened a response: what the model says in it comes
        back as ``Chunks`` notices and one ``StreamEnd``."""
        ...

    def take(self, response_id: str) -> list[UnitOutput]:
        """The output produced for a response since the last take."""
        ...

    def forget(self, response_id: str) -> None:
        """The response's stream ended; drop what is kept for it."""
        ...

    def stop(self, response_id: str) -> None:
        """The session fenced the response off (cancel, barge-in, clear)."""
        ...

    def stop_all(self) -> None: ...

    async def close(self) -> None: ...


def open_feed(
    model: ModelPort,
    session_id: str,
    post: Callable[[mb.ModelMessage], None],
    epoch: Callable[[], int],
    setup: Callable[[], StreamSetup | None] = StreamSetup,
    text_delta_interval_s: float = 0.0,
) -> ModelFeed:
    """The feed for ``model``'s way of taking input; ``post`` queues on the
    session's mailbox, ``epoch`` reads the session's current epoch, ``setup``
    what a primed model hears first (None while the session has no input),
    ``text_delta_interval_s`` how long a turn model's text gathers after
    its first delta."""
    if model.streaming is not None and model.answering is not None:
        raise ValueError(f"model {model.name!r} offers both ports; a model takes input one way")
    if model.streaming is not None:
        return UnitFeed(model.streaming, session_id, post, epoch, setup)
    if model.answering is not None:
        return TurnFeed(model.answering, post, text_delta_interval_s)
    raise ValueError(f"model {model.name!r} takes input neither by unit nor by turn")
