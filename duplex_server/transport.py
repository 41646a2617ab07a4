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
        if self.per_s <= 0:
            return True
        burst = self.per_s * self.BURST_S
        tokens, at = self._buckets.get(address, (burst, now_s))
        tokens = min(burst, tokens + (now_s - at) * self.per_s)
        admitted = tokens >= 1.0
        self._buckets[address] = (tokens - 1.0 if admitted else tokens, now_s)
        if len(self._buckets) > self.FORGET_ABOVE:
            self._forget_full(now_s, burst)
        return admitted

    def _forget_full(self, now_s: float, burst: float) -> None:
        self._buckets = {
            address: (tokens, at)
            for address, (tokens, at) in self._buckets.items()
            if tokens + (now_s - at) * self.per_s < burst
        }


def guarded_http(
    header_timeout_s: float, max_per_address: int, rate_per_address: float = 0.0
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline for each request head,
    at most ``max_per_address`` open HTTP connections per client address
    (0: no cap), and at most ``rate_per_address`` new ones a second (0: no
    bound); a connection past either is closed at once."""
    open_per_address: Counter[str] = Counter()
    rate = ConnectionRate(rate_per_address)

    class GuardedHttp(HttpToolsProtocol):
        _address: str | None = None
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else ""
            over_cap = max_per_address and open_per_address[address] >= max_per_address
            if over_cap or not rate.admit(address, time.monotonic()):
                reason = "address_connections" if over_cap else "address_connection_rate"
                metrics.ADMISSIONS_REFUSED.labels(reason).inc()
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
