"""The engine streams of one session: started, pumped into the mailbox, aborted.

A pump never touches session state: it posts each chunk (tagged with the
response and epoch it was started for) to the actor's mailbox, where the
epoch fence decides whether it may still reach the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from duplex_server.sessions import mailbox as mb
from duplex_server.sessions.model_port import ModelPort, ResponseRequest

log = logging.getLogger(__name__)


class ResponseStreams:
    def __init__(self, model: ModelPort, post: Callable[[object], None]) -> None:
        self.model = model
        self._post = post
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, request: ResponseRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._pump(request))
        self._tasks[request.response_id] = task

    async def _pump(self, request: ResponseRequest) -> None:
        error = None
        try:
            async for chunk in self.model.stream(request):
                self._post(mb.Chunk(request.response_id, request.epoch, chunk))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - surfaced below, never swallowed
            # Whatever a model adapter raises ends this response as failed (the
            # client gets engine_error with the reason, the log has the traceback);
            # it must not leave the response in progress forever or end the session.
            error = f"{type(exc).__name__}: {exc}"
            log.exception("engine stream for %s failed", request.response_id)
        self._post(mb.StreamEnd(request.response_id, request.epoch, error))

    def forget(self, response_id: str) -> None:
        self._tasks.pop(response_id, None)

    def abort(self, response_id: str) -> None:
        self.model.abort(response_id)
        task = self._tasks.pop(response_id, None)
        if task is not None:
            task.cancel()

    def abort_all(self) -> None:
        for response_id in list(self._tasks):
            self.abort(response_id)
