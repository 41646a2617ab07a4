"""One probe of a remote tier at a time, its answer shared a while.

``/ready`` asks every remote tier (the LLM, the recogniser, the voice)
whether it answers; a balancer polls it often, and each poll must not
become a request to the remote. So the first caller starts the probe, the
callers meanwhile share its answer, and the answer stands ``every_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

PROBE_EVERY_S = 1.0


class SharedProbe:
    def __init__(
        self, probe: Callable[[], Awaitable[str | None]], every_s: float = PROBE_EVERY_S
    ) -> None:
        self._probe = probe
        self._every_s = every_s
        self._task: asyncio.Future[str | None] | None = None
        self._at = 0.0

    async def __call__(self) -> str | None:
        """Why the remote cannot answer now (None: it can)."""
        stale = self._task is not None and self._task.done()
        if self._task is None or (stale and time.monotonic() - self._at > self._every_s):
            self._at = time.monotonic()
            self._task = asyncio.ensure_future(self._probe())
        return await asyncio.shield(self._task)
