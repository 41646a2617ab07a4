"""The decoding inside a running server's LLM backend, watched and held the
same way on both backends: how many answers were decoded together (they
are batched), how many tokens an answer got, and a hold that freezes
decoding once an answer has ``tokens`` tokens, as a slow machine would, so
that a cancel or a barge-in surely lands while that answer is still being
decoded.

transformers: the decode thread's step is wrapped (the thread waits after a
forward, holding the whole batch). vLLM: its scheduler is paused with
``pause_generation(mode="keep")`` (requests stay frozen in its engine core,
unfinished) and resumed with ``resume_generation``; the pause is asked for
on the engine's own loop as soon as an output says the answer reached
``tokens``, so the engine core may run a step or two on before it freezes
(tests hold early in a long answer, and check it was still unfinished)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

# A bound on a broken run (the engine never freezes, or never lets go of a
# request), not a measurement.
WAIT_S = 120.0


class Decoding(Protocol):
    @property
    def peak(self) -> int:
        """The most answers decoded together since this was attached."""
        ...

    def hold_at(self, tokens: int) -> None:
        """Freeze decoding once an answer has ``tokens`` tokens (once)."""
        ...

    async def frozen(self) -> str:
        """Wait until the hold took; the held answer's request id."""
        ...

    def decoded(self, request_id: str) -> int:
        """Tokens decoded for the request so far."""
        ...

    def stopped(self, request_id: str) -> bool:
        """The backend was told to stop decoding it (its stream closed)."""
        ...

    def decoding(self, request_id: str) -> bool:
        """The engine still decodes it (it is in the batch)."""
        ...

    def unfinished(self) -> int:
        """Requests the engine still decodes (not ended, not aborted)."""
        ...

    async def release(self) -> None: ...

    def detach(self) -> None:
        """Undo the wrapping (a hold still in place is released)."""
        ...


def decoding_of(server: Any) -> Decoding:
    backend = server.app.state.model.responder.engine.core.backend
    if type(backend).__name__ == "VllmBackend":
        return VllmDecoding(backend)
    return TransformersDecoding(backend)


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition()`` on this loop until it holds (bounded by WAIT_S)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        assert loop.time() < deadline, f"still not {what} after {WAIT_S:g} s"
        await asyncio.sleep(0.01)


class TransformersDecoding:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._since = len(backend.step_sizes)
        self._tokens: int | None = None
        self._held: dict[str, Any] = {}  # request id -> its _Active, once seen held
        self._frozen = threading.Event()
        self._resume = threading.Event()
        self._step = backend._step
        backend._step = self._step_then_maybe_wait

    def _step_then_maybe_wait(self) -> None:
        self._step()
        tokens = self._tokens
        ready = [a for a in self.backend._active if tokens and len(a.generated) >= tokens]
        if not ready:
            return
        self._tokens = None
        self._held = {active.request_id: active for active in ready}
        self._frozen.set()
        self._resume.wait(WAIT_S)

    @property
    def peak(self) -> int:
        return max(self.backend.step_sizes[self._since :], default=0)

    def hold_at(self, tokens: int) -> None:
        self._frozen.clear()
        self._resume.clear()
        self._tokens = tokens

    async def frozen(self) -> str:
        assert await asyncio.to_thread(self._frozen.wait, WAIT_S), "the decoding never froze"
        (request_id,) = self._held
        return request_id

    def decoded(self, request_id: str) -> int:
        return len(self._held[request_id].generated)

    def stopped(self, request_id: str) -> bool:
        return request_id in self.backend._leaving or not self.decoding(request_id)

    def decoding(self, request_id: str) -> bool:
        return any(active.request_id == request_id for active in self.backend._active)

    def unfinished(self) -> int:
        return len(self.backend._active)

    async def release(self) -> None:
        self._resume.set()

    def detach(self) -> None:
        self.backend._step = self._step
        self._tokens = None
        self._resume.set()


class VllmDecoding:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.engine = backend._engine  # vLLM's AsyncLLM, on the backend's loop
        self._running: set[str] = set()
        self._decoded: dict[str, int] = {}
        self._peak = 0
        self._tokens: int | None = None
        self._held: str | None = None
        self._paused = False
        self._frozen = threading.Event()
        self._generate = self.engine.generate
        self.engine.generate = self._watched

    async def _watched(
        self, prompt: Any, params: Any, request_id: str, *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """vLLM's ``generate``, counted; it pauses the scheduler when held."""
        self._running.add(request_id)
        self._peak = max(self._peak, len(self._running))
        self._decoded[request_id] = 0
        try:
            async for output in self._generate(prompt, params, request_id, *args, **kwargs):
                self._decoded[request_id] += len(output.outputs[0].token_ids)  # DELTA outputs
                tokens = self._tokens
                if tokens and self._decoded[request_id] >= tokens:
                    self._tokens = None
                    await self.engine.pause_generation(mode="keep", clear_cache=False)
                    self._paused, self._held = True, request_id
                    self._frozen.set()
                yield output
        finally:
            self._running.discard(request_id)

    @property
    def peak(self) -> int:
        return self._peak

    def hold_at(self, tokens: int) -> None:
        self._frozen.clear()
        self._tokens = tokens

    async def frozen(self) -> str:
        assert await asyncio.to_thread(self._frozen.wait, WAIT_S), "the decoding never froze"
        assert self._held is not None
        return self._held

    def decoded(self, request_id: str) -> int:
        return self._decoded[request_id]

    def stopped(self, request_id: str) -> bool:
        # vLLM's generate aborts the request before its stream ends
        return request_id not in self._running

    def decoding(self, request_id: str) -> bool:
        return request_id in self._running

    def unfinished(self) -> int:
        return self.backend.unfinished_requests()

    async def release(self) -> None:
        if self._paused:
            self._paused = False
            resume = asyncio.run_coroutine_threadsafe(
                self.engine.resume_generation(), self.backend._loop
            )
            await asyncio.wrap_future(resume)

    def detach(self) -> None:
        self.engine.generate = self._generate
        self._tokens = None
        if self._paused:
            self._paused = False
            asyncio.run_coroutine_threadsafe(
                self.engine.resume_generation(), self.backend._loop
            ).result(WAIT_S)
