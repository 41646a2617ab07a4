"""The engine streams of one session: started, pumped into the mailbox, aborted.

A pump never touches session state. It queues each chunk for its response and
posts one ``Chunks`` notice (tagged with the response and epoch it was started
for) when the queue goes from empty to non-empty; the actor then takes all
pending chunks in one batch, where the epoch fence decides whether they may
still reach the log. An engine faster than real time thus costs one batch per
burst instead of one per chunk, and the order of everything is unchanged: the
end-of-stream notice is posted after the last chunk's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from duplex_server.sessions.core.model_port import ModelChunk, ModelPort, ResponseRequest
from duplex_server.sessions.runtime import mailbox as mb

log = logging.getLogger(__name__)


class ResponseStreams:
    def __init__(self, model: ModelPort, post: Callable[[object], None]) -> None:
        self.model = model
        self._post = post
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._pending: dict[str, list[ModelChunk]] = {}

    def start(self, request: ResponseRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._pump(request))
        self._tasks[request.response_id] = task

    async def _pump(self, request: ResponseRequest) -> None:
        error = None
        try:
            async for chunk in self.model.stream(request):
                pending = self._pending.setdefault(request.response_id, [])
                pending.append(chunk)
                if len(pending) == 1:
                    self._post(mb.Chunks(request.response_id, request.epoch))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - surfaced below, never swallowed
            # Whatever a model adapter raises ends this response as failed (the
            # client gets engine_error with the reason, the log has the traceback);
            # it must not leave the response in progress forever or end the session.
            error = f"{type(exc).__name__}: {exc}"
            log.exception("engine stream for %s failed", request.response_id)
        self._post(mb.StreamEnd(request.response_id, request.epoch, error))

    def take(self, response_id: str) -> list[ModelChunk]:
        """Every chunk produced for the response since the last take."""
        return self._pending.pop(response_id, [])

    def forget(self, response_id: str) -> None:
        self._tasks.pop(response_id, None)
        self._pending.pop(response_id, None)

    def abort(self, response_id: str) -> None:
        self.model.abort(response_id)
        self._pending.pop(response_id, None)
        task = self._tasks.pop(response_id, None)
        if task is not None:
            task.cancel()

    def abort_all(self) -> None:
        for response_id in list(self._tasks):
            self.abort(response_id)
