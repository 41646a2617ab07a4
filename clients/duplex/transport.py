"""What the client needs from a connection, and the websocket that provides it.

``DuplexClient(connect=...)`` takes any ``url -> Transport`` coroutine
function, so a test or an app can hand it its own socket (a fake peer, a
proxy, a tunnel). A transport says it has ended by raising
``websockets.ConnectionClosed`` or a ``ConnectionError`` from ``recv`` or
``send``; the client then resumes the session on a new one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import websockets


class Transport(Protocol):
    async def send(self, message: str | bytes) -> None:
        """A str is a text frame; bytes a binary frame (binary audio only)."""
        ...

    async def recv(self) -> str | bytes: ...

    async def close(self) -> None: ...


Connect = Callable[[str], Awaitable[Transport]]

TRANSPORT_CLOSED = (websockets.ConnectionClosed, ConnectionError)


def websocket(api_key: str | None = None) -> Connect:
    """The default: a websockets connection, ``api_key`` as a bearer token.
    No pings: the session's heartbeat keeps it alive, and a resume repairs a drop."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None

    async def connect(url: str) -> Transport:
        return await websockets.connect(
            url, max_size=None, additional_headers=headers, ping_interval=None
        )

    return connect
