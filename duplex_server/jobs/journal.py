"""A job session's records: writing them under the job's lease, reading a
job back from them."""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass

from duplex_server.sessions.core import records as r
from duplex_server.sessions.log.store import SessionLog
from protocol.session_config import SessionUpdate


def new_job_id() -> str:
    return r.JOB_SESSION_PREFIX + secrets.token_urlsafe(18)


def keyed_job_id(principal: str, idempotency_key: str) -> str:
    """The job an ``Idempotency-Key`` names, scoped to the principal: derived,
    so that the store's own append order decides which of two concurrent
    requests under one key runs it (the other finds its records), on every
    backend and across replicas, without a second index."""
    digest = hashlib.sha256(f"{principal}\0{idempotency_key}".encode()).digest()
    return r.JOB_SESSION_PREFIX + base64.urlsafe_b64encode(digest[:18]).decode()


class JobWriter:
    """Appends a job's records in order, under the fence it holds."""

    def __init__(self, log: SessionLog, job_id: str, fence: int, last_seq: int = 0) -> None:
        self.log = log
        self.job_id = job_id
        self.fence = fence
        self.last_seq = last_seq
        self.created_ms: int | None = None  # when this writer opened the job

    async def append(self, *bodies: r.AnyBody) -> None:
        now_ms = int(time.time() * 1000)
        if self.last_seq == 0:
            self.created_ms = now_ms
        records = [
            r.Record(epoch=0, ts_ms=now_ms, origin="server", body=body, seq=self.last_seq + i)
            for i, body in enumerate(bodies, start=1)
        ]
        await self.log.append(self.job_id, records, self.fence)
        self.last_seq += len(records)

    async def open(self, owner: str, job: r.JobBody) -> None:
        """The opening records: who asked (the same ``config`` record a
        realtime session opens with, so the log routes scope it to its
        owner), then what."""
        await self.append(r.ConfigBody(patch=SessionUpdate(), owner=owner), job)


@dataclass
class StoredJob:
    """A job as its records tell it."""

    job_id: str
    owner: str | None
    job: r.JobBody | None
    result: r.ResultBody | None
    progress: int
    closed: bool
    last_seq: int
    created_ms: int
    finished_ms: int | None = None  # when the result was recorded

    @classmethod
    def of(cls, job_id: str, records: list[r.Record]) -> StoredJob:
        owner = None
        job = None
        result = None
        progress = 0
        closed = False
        finished_ms = None
        for record in records:
            body = record.body
            if isinstance(body, r.ConfigBody) and body.owner is not None:
                owner = body.owner
            elif isinstance(body, r.JobBody):
                job = body
            elif isinstance(body, r.ProgressBody):
                progress = body.percent
            elif isinstance(body, r.ResultBody):
                result, finished_ms = body, record.ts_ms
            elif isinstance(body, r.CloseBody):
                closed = True
        return cls(
            job_id,
            owner,
            job,
            result,
            progress,
            closed,
            records[-1].seq if records else 0,
            records[0].ts_ms if records else 0,
            finished_ms,
        )

    def blobs(self) -> list[r.BlobRef]:
        refs = list(self.job.inputs) if self.job is not None else []
        if self.result is not None:
            if self.result.output is not None:
                refs.append(self.result.output)
            refs.extend(self.result.assets.values())
        return refs
