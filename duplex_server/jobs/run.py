"""What a job is: the request a route validated (:class:`JobRequest`),
how its route runs one (:class:`JobKind` and its producer, given a
:class:`JobInput`), and a job as its requesters see it (:class:`JobRun`,
ending in an :class:`Outcome`). :class:`JobError` is an answer instead of
a body: an HTTP status and OpenAI's error fields.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from duplex_server.jobs.journal import StoredJob
from duplex_server.sessions.core import records as r

T = TypeVar("T")


class JobError(Exception):
    """What a job answers instead of a body: an HTTP status and the fields
    of an OpenAI-style error (``param`` names the field at fault)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param


@dataclass
class JobInput:
    """What a producer gets: the validated request body (JSON), the
    uploads, a way to report progress, ``offload`` for its CPU work
    (encoding, decoding: the runner's bounded pool, never the event loop),
    ``metadata`` it may fill for the route (stored as JSON in the result
    record) and ``assets``, media made beside the body (name -> bytes and
    content type), stored as blobs the result record names."""

    job_id: str
    params: bytes
    uploads: list[bytes]
    progress: Callable[[int, str], Awaitable[None]]
    offload: Offload
    metadata: dict[str, object] = field(default_factory=dict)
    assets: dict[str, tuple[bytes, str]] = field(default_factory=dict)


class Offload(Protocol):
    """Runs ``fn(*args)`` on the runner's batch CPU pool."""

    def __call__(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...


# A producer yields the response body in chunks, as it is made; raising
# JobError ends the job with that answer.
Producer = Callable[[JobInput], AsyncIterator[bytes]]


@dataclass(frozen=True)
class JobKind:
    """A route's jobs: how to run one from its stored request, the content
    type of its body (from the request), and whether clients list them
    (``listed``: the runner keeps an index of them, :mod:`jobs.index`)."""

    route: str
    produce: Producer
    content_type: Callable[[bytes], str]
    listed: bool = False


@dataclass
class JobRequest:
    """A request to run, as the route validated it."""

    route: str
    principal: str
    params: bytes  # canonical JSON of the validated body
    idempotency_key: str | None = None
    uploads: list[tuple[bytes, str]] = field(default_factory=list)  # (bytes, content type)

    def digest(self) -> str:
        """Same route, same body, same uploads: the same request."""
        h = hashlib.sha256(self.route.encode() + b"\0" + self.params)
        for data, content_type in self.uploads:
            h.update(b"\0" + content_type.encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()


@dataclass
class Outcome:
    """How a job ended, as its ``result`` record says."""

    job_id: str
    status: r.JobStatus
    http_status: int
    content_type: str
    body: bytes
    metadata: dict[str, object]
    error: JobError | None
    replayed: bool  # served from the log: nothing ran for this request


class JobRun:
    """A job as its requesters see it: the body's chunks as they are made
    (for a streamed response) and, at the end, the outcome."""

    def __init__(self, job_id: str, request_digest: str, principal: str) -> None:
        self.job_id = job_id
        self.request_digest = request_digest
        self.principal = principal
        self.chunks: list[bytes] = []
        self._changed = asyncio.Event()
        self.outcome: Outcome | None = None

    def push(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self._changed.set()

    def finish(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self._changed.set()

    async def wait(self) -> Outcome:
        while self.outcome is None:
            self._changed.clear()
            await self._changed.wait()
        return self.outcome

    async def started(self) -> None:
        """Until the first chunk or the outcome: whether a streamed answer
        can begin with a 200 or must be the job's error."""
        while not self.chunks and self.outcome is None:
            self._changed.clear()
            await self._changed.wait()

    async def stream(self) -> AsyncIterator[bytes]:
        """The body from its first byte, chunk by chunk as the producer
        makes it; a replayed job's stored body in one chunk. A failed job's
        stream ends where its producer stopped (``outcome`` says why)."""
        sent = 0
        while True:
            if sent < len(self.chunks):
                sent += 1
                yield self.chunks[sent - 1]
                continue
            if self.outcome is not None:
                if not self.chunks and self.outcome.body:
                    yield self.outcome.body
                return
            self._changed.clear()
            await self._changed.wait()


def outcome_of(stored: StoredJob, body: bytes, content_type: str, replayed: bool) -> Outcome:
    result = stored.result
    assert result is not None
    error = None
    if result.status == "failed":
        error = JobError(
            result.http_status,
            result.error_code or "engine_error",
            result.error_message or "",
            result.error_param,
        )
    return Outcome(
        stored.job_id,
        result.status,
        result.http_status,
        content_type,
        body,
        json.loads(result.metadata or b"{}"),
        error,
        replayed,
    )
