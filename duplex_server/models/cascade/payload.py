"""What the cascade hands a responder for one answer.

Its own module because the model builds it and the responders (the parrot,
the chat model) read it: kept in ``model.py`` it made the responders import
the model that imports them (a circle hidden behind ``TYPE_CHECKING``).
"""

from __future__ import annotations

import msgspec

from duplex_server.sessions.core.model_port import HistoryItem, SessionView


class SpeakPayload(msgspec.Struct):
    history: list[HistoryItem]
    voice: str
    speed: float
    text_only: bool
    # The response's settings: what an LLM responder answers under
    # (instructions, sampling, tools; the parrot ignores them).
    config: SessionView
