"""How much media a session may still send: input is admitted at most
``factor`` times real time, plus a burst.

A token bucket of media milliseconds: it refills at ``factor`` ms per
millisecond of wall time and holds at most ``burst_ms``. An append is
admitted while the bucket is not empty and charged its real duration once
decoded, so a large append may overdraw it and the ones after it wait. Ten
thousand appends sent as fast as a socket allows thus cost the server what
``factor`` x real time costs, not what the client's link can carry.
"""

from __future__ import annotations


class InputBudget:
    def __init__(self, factor: float, burst_ms: float, now_s: float) -> None:
        self.factor = factor  # 0: unbounded
        self.burst_ms = burst_ms
        self._tokens_ms = burst_ms
        self._at_s = now_s

    def admits(self, now_s: float) -> bool:
        if self.factor <= 0:
            return True
        self._refill(now_s)
        return self._tokens_ms > 0

    def charge(self, media_ms: float, now_s: float) -> None:
        self._refill(now_s)
        self._tokens_ms -= media_ms

    def _refill(self, now_s: float) -> None:
        elapsed_ms = max(0.0, now_s - self._at_s) * 1000
        self._tokens_ms = min(self.burst_ms, self._tokens_ms + elapsed_ms * self.factor)
        self._at_s = now_s
