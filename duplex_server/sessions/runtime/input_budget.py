"""How much media a session may still send: at most ``factor`` times real
time plus a burst, and at most ``max_bytes`` over its whole life.

The rate is a token bucket of media milliseconds: it refills at ``factor``
ms per millisecond of wall time and holds at most ``burst_ms``. An append
is admitted while the bucket is not empty and charged its real duration
once decoded, so a large append may overdraw it and the ones after it wait.
Ten thousand appends sent as fast as a socket allows thus cost the server
what ``factor`` x real time costs, not what the client's link can carry.
The byte cap bounds what one session can make the log hold (audio samples
and video frames), however slowly it sends.

Refusing costs work too (each refused append is still read, parsed and
answered), so after a rate refusal the session's socket is not read for
``REFUSAL_PAUSE_S``: a flood then waits in the client's TCP buffer, at no
cost to the server, and one flooding client gets about ten refusals a
second instead of thousands.
"""

from __future__ import annotations

from protocol.errors import ProtocolError

REFUSAL_PAUSE_S = 0.1


class InputBudget:
    def __init__(self, factor: float, burst_ms: float, max_bytes: int, now_s: float) -> None:
        self.factor = factor  # 0: no rate bound
        self.burst_ms = burst_ms
        self.max_bytes = max_bytes  # 0: no total bound
        self.used_bytes = 0
        self._tokens_ms = burst_ms
        self._at_s = now_s
        self._refused_at_s: float | None = None

    def refusal(self, now_s: float) -> ProtocolError | None:
        """Why more input is refused now, or None when it is admitted."""
        if self.max_bytes and self.used_bytes >= self.max_bytes:
            return ProtocolError(
                "resource_exhausted",
                f"this session has sent its limit of {self.max_bytes} bytes of media; "
                "open a new session",
            )
        if self.factor <= 0:
            return None
        self._refill(now_s)
        if self._tokens_ms > 0:
            return None
        self._refused_at_s = now_s
        return ProtocolError(
            "rate_limited", f"media is arriving faster than {self.factor:g}x real time; slow down"
        )

    def read_pause_s(self, now_s: float) -> float:
        """How long the socket should go unread: the rest of the pause that
        follows a rate refusal."""
        if self._refused_at_s is None:
            return 0.0
        return max(0.0, self._refused_at_s + REFUSAL_PAUSE_S - now_s)

    def charge(self, media_ms: float, media_bytes: int, now_s: float) -> None:
        self._refill(now_s)
        self._tokens_ms -= media_ms
        self.used_bytes += media_bytes

    def _refill(self, now_s: float) -> None:
        elapsed_ms = max(0.0, now_s - self._at_s) * 1000
        self._tokens_ms = min(self.burst_ms, self._tokens_ms + elapsed_ms * self.factor)
        self._at_s = now_s
