"""Which session, and which of its responses, a log line is written for.

The session actor binds itself when its task starts. asyncio copies the
context into the tasks started from there (the model feed's pumps and
steps) and into ``asyncio.to_thread`` calls, so a line logged while serving
a session names it without every call passing the id along; the response
is looked up when the line is written, so it is the one in progress then.
Work handed to an executor or to another process carries no context.
``duplex_server.log_format`` puts both on JSON log lines.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol


class _Response(Protocol):
    @property
    def id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class SessionLogContext:
    session_id: str
    active_response: Callable[[], _Response | None]


_CURRENT: ContextVar[SessionLogContext | None] = ContextVar("duplex_session_log", default=None)


def bind(session_id: str, active_response: Callable[[], _Response | None]) -> None:
    """From here on, in this task and the tasks it starts, lines name this
    session, and ``active_response()``, the response in progress."""
    _CURRENT.set(SessionLogContext(session_id, active_response))


def current() -> tuple[str | None, str | None]:
    """(session id, id of its response in progress), ``None`` where there is none."""
    context = _CURRENT.get()
    if context is None:
        return None, None
    response = context.active_response()
    return context.session_id, None if response is None else response.id
