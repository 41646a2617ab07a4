"""How the server meets the network: uvicorn's settings, one place for the
CLI and the tests, so the limits the tests exercise are the ones served.

uvicorn closes an idle keep-alive connection, but not one that never
finishes a request head: a client that connects and says nothing, or sends
half a request, would hold a socket (and a file descriptor) forever. The
HTTP protocol here gives every request head a deadline and caps the HTTP
connections one client address may hold; a connection that upgrades to a
WebSocket leaves that count, and the WebSocket endpoint caps its own.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from duplex_server import metrics
from duplex_server.config import ServerConfig

# Room around an event's largest field: a frame up to max_frame_bytes plus
# this is read and refused with a coded payload_too_large; anything larger is
# refused by the WebSocket layer (close 1009) before it is buffered.
FRAME_ENVELOPE_BYTES = 64 * 1024


class ConnectionRate:
    """New connections per second per client address: a token bucket each,
    ``per_s`` a second with a burst of ``BURST_S`` seconds' worth. Checked
    before a byte is parsed, so a client reconnecting as fast as it can
    (to guess resume tokens, say) costs the server an accept and a close.
    Buckets that have refilled are forgotten once there are many."""

    BURST_S = 2.0
    FORGET_ABOVE = 4096

    def __init__(self, per_s: float) -> None:
        self.per_s = per_s  # 0: no bound
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)

    def admit(self, address: str, now_s: float) -> bool:
        return self.wait_s(address, now_s) == 0.0

    def wait_s(self, address: str, now_s: float) -> float:
        """0 when a connection from ``address`` is admitted now (and takes
        its token); else how long until it would be."""
        if self.per_s <= 0:
            return 0.0
        burst = self.per_s * self.BURST_S
        tokens, at = self._buckets.get(address, (burst, now_s))
        tokens = min(burst, tokens + (now_s - at) * self.per_s)
        admitted = tokens >= 1.0
        self._buckets[address] = (tokens - 1.0 if admitted else tokens, now_s)
        if len(self._buckets) > self.FORGET_ABOVE:
            self._forget_full(now_s, burst)
        return 0.0 if admitted else (1.0 - tokens) / self.per_s

    def _forget_full(self, now_s: float, burst: float) -> None:
        self._buckets = {
            address: (tokens, at)
            for address, (tokens, at) in self._buckets.items()
            if tokens + (now_s - at) * self.per_s < burst
        }


def too_many(retry_after_s: int) -> bytes:
    """The whole answer to a connection refused before its request is read:
    ``429`` in OpenAI's error shape with ``Retry-After``, written as it is
    (one cached buffer per wait), so that a refusal under attack costs an
    accept, a write and a close."""
    return _TOO_MANY.get(retry_after_s) or _TOO_MANY.setdefault(
        retry_after_s, _static_429(retry_after_s)
    )


_TOO_MANY: dict[int, bytes] = {}


def _static_429(retry_after_s: int) -> bytes:
    body = (
        b'{"error":{"type":"rate_limit_error","code":"rate_limited","message":'
        b'"too many connections from this address; retry after the Retry-After seconds",'
        b'"param":null}}'
    )
    head = (
        f"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: {retry_after_s}\r\n"
        f"connection: close\r\n\r\n"
    )
    return head.encode() + body


def guarded_http(
    header_timeout_s: float, max_per_address: int, rate_per_address: float = 0.0
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline for each request head,
    at most ``max_per_address`` open HTTP connections per client address
    (0: no cap), and at most ``rate_per_address`` new ones a second (0: no
    bound); a connection past either is answered ``429`` (:func:`too_many`)
    and closed, its request never read."""
    open_per_address: Counter[str] = Counter()
    rate = ConnectionRate(rate_per_address)

    class GuardedHttp(HttpToolsProtocol):
        _address: str | None = None
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else ""
            over_cap = max_per_address and open_per_address[address] >= max_per_address
            wait_s = 1.0 if over_cap else rate.wait_s(address, time.monotonic())
            if wait_s:
                reason = "address_connections" if over_cap else "address_connection_rate"
                metrics.ADMISSIONS_REFUSED.labels(reason).inc()
                transport.write(too_many(max(1, math.ceil(wait_s))))
                transport.close()
                return
            open_per_address[address] += 1
            self._address = address
            self._arm()

        def on_message_begin(self) -> None:
            self._arm()  # each request on a kept-alive connection gets its own deadline
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def handle_websocket_upgrade(self) -> None:
            self._release()  # the WebSocket endpoint counts it from here
            super().handle_websocket_upgrade()
            # The parser and this protocol refer to each other, and an upgraded
            # connection never reaches connection_lost (where uvicorn breaks
            # that cycle): left to the cyclic GC, whose thresholds ``serve``
            # raises, a few thousand of them made one 54 ms collection.
            self.parser = None  # type: ignore[assignment]

        def connection_lost(self, exc: Exception | None) -> None:
            self._release()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout_s, self.transport.close)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _release(self) -> None:
            self._disarm()
            if self._address is not None:
                open_per_address[self._address] -= 1
                if not open_per_address[self._address]:
                    del open_per_address[self._address]
                self._address = None

    return GuardedHttp


def uvicorn_config(
    app: Starlette, config: ServerConfig, *, log_level: str | None = None
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level or config.log_level,
        http=guarded_http(
            config.header_timeout_s,
            config.max_connections_per_ip,
            config.max_connection_rate_per_ip,
        ),
        ws_max_size=config.max_frame_bytes + FRAME_ENVELOPE_BYTES,
        ws_ping_interval=None,
        ws_per_message_deflate=config.ws_per_message_deflate,
        ssl_certfile=config.ssl_certfile,
        ssl_keyfile=config.ssl_keyfile,
    )
