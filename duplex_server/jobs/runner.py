"""The job runner: one-shot sessions on the log, run once.

A request becomes a job session (``config`` with its owner, ``job`` with what
was asked), the route's producer runs it through the engine at batch
priority and yields the response body chunk by chunk, the body goes to the
blob store and a ``result`` record names it, and the session closes. Every
answer comes from that record, so an idempotent retry is served from the log
without running anything, and a job the server was killed in the middle of is
run again from its ``job`` record after the restart.

Routes use :meth:`JobRunner.submit` (and :meth:`job`, :meth:`jobs`,
:meth:`delete` for asynchronous jobs a client polls); the app calls
:meth:`recover_or_defer`, :meth:`start` and :meth:`shutdown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from duplex_server import metrics
from duplex_server.jobs.blobs import BlobMissing, BlobStore
from duplex_server.jobs.index import JobIndex, Page
from duplex_server.jobs.journal import JobWriter, StoredJob, keyed_job_id, new_job_id
from duplex_server.jobs.run import (
    JobError,
    JobInput,
    JobKind,
    JobRequest,
    JobRun,
    Outcome,
    outcome_of,
)
from duplex_server.sessions.core import records as r
from duplex_server.sessions.log.store import (
    LeaseHeld,
    LogError,
    SequenceConflict,
    SessionLog,
    UnknownSession,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_RESULT_BYTES = 256 * 1024 * 1024  # one response body
ORPHAN_BLOB_GRACE_S = 3600.0  # a blob no record names is deleted after this
MAX_IDEMPOTENCY_KEY_CHARS = 255


HOUSEKEEPING_TASK = "job-housekeeping"  # names its task: its reads are not a request's


@dataclass
class RunnerSettings:
    owner: str  # this replica: the jobs' lease owner
    retention_s: float = 86_400.0
    max_jobs: int = 64  # jobs running or queued in this process
    max_jobs_per_key: int = 8
    sweep_interval_s: float = 60.0
    lease_renew_s: float = 5.0 / 3  # shared stores: a running job's lease is renewed this often
    # Threads for jobs' CPU work (encoding, decoding): bounded, so batch work
    # cannot take every core from live sessions.
    cpu_workers: int = 1


class JobRunner:
    def __init__(self, log: SessionLog, blobs: BlobStore, settings: RunnerSettings) -> None:
        self.log = log
        self.blobs = blobs
        self.settings = settings
        self._cpu = ThreadPoolExecutor(settings.cpu_workers, thread_name_prefix="batch-cpu")
        self.kinds: dict[str, JobKind] = {}
        self.runs: dict[str, JobRun] = {}  # jobs running in this process
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._fences: dict[str, int] = {}
        self._per_key: Counter[str] = Counter()
        self._unlogged: Counter[str] = Counter()  # blobs written, their record not yet
        self._blob_lock = asyncio.Lock()  # puts vs. the sweep's deletes
        self._housekeeper: asyncio.Task[None] | None = None
        self._recovery_pending = False
        self.executions = 0  # producer runs started in this process (the tests count them)
        self.index = JobIndex()
        self._examined: set[str] = set()  # job ids the index has looked at, listed or not
        self._index_build: asyncio.Task[None] | None = None

    def register(self, kind: JobKind) -> None:
        self.kinds[kind.route] = kind
        if kind.listed:
            self.index.routes.add(kind.route)

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the batch CPU pool (``cpu_workers`` threads)."""
        return await asyncio.get_running_loop().run_in_executor(self._cpu, fn, *args)

    # --- submitting -----------------------------------------------------------

    async def submit(self, request: JobRequest) -> JobRun:
        """The run that answers ``request``: a new job, the one already
        running under its idempotency key, or a finished one replayed from
        the log. Raises JobError for a reused key, a key still in use on
        another replica, or a principal (or server) at its limit."""
        if request.idempotency_key is not None:
            check_idempotency_key(request.idempotency_key)
            job_id = keyed_job_id(request.principal, request.idempotency_key)
        else:
            job_id = new_job_id()
        digest = request.digest()
        running = self.runs.get(job_id)
        if running is not None:
            _same_request(running.request_digest, digest)
            return running
        if request.idempotency_key is not None:
            try:
                stored = StoredJob.of(job_id, await self.log.read(job_id))
            except UnknownSession:
                stored = None
            if stored is not None and stored.job is not None:
                return await self._existing(stored, digest)
            running = self.runs.get(job_id)  # claimed while we read
            if running is not None:
                _same_request(running.request_digest, digest)
                return running
        self._admit(request.principal)
        run = JobRun(job_id, digest, request.principal)
        self._claim(run)  # before the first await
        try:
            opened = await self._open(job_id, request, digest)
        except BaseException:
            self._forget(run)
            raise
        if opened is None:  # another replica's request under this key got there first
            self._forget(run)
            stored = StoredJob.of(job_id, await self.log.read(job_id))
            return await self._existing(stored, digest)
        writer, job = opened
        self._examined.add(job_id)
        self.index.add(job_id, request.principal, request.route, writer.created_ms or 0)
        self._start(run, writer, job, [data for data, _ in request.uploads])
        return run

    def _admit(self, principal: str) -> None:
        if self._per_key[principal] >= self.settings.max_jobs_per_key:
            raise JobError(
                429,
                "too_many_jobs",
                f"this key has {self.settings.max_jobs_per_key} jobs in flight, its limit; "
                "retry when one has finished",
            )
        if len(self.runs) >= self.settings.max_jobs:
            raise JobError(
                429,
                "server_busy",
                f"the server runs {self.settings.max_jobs} jobs, its limit; retry later",
            )

    async def _open(
        self, job_id: str, request: JobRequest, digest: str
    ) -> tuple[JobWriter, r.JobBody] | None:
        """The job's session with its opening records; None if another
        writer opened it first (the same key, another replica)."""
        try:
            await self.log.create(job_id)
            fence = await self.log.acquire_lease(job_id, self.settings.owner)
        except LeaseHeld:
            return None
        except LogError as exc:
            raise JobError(503, "storage_unavailable", f"the job log failed: {exc}") from exc
        inputs = [await self._put(data, content_type) for data, content_type in request.uploads]
        writer = JobWriter(self.log, job_id, fence)
        body = r.JobBody(request.route, request.params, digest, request.idempotency_key, inputs)
        try:
            await writer.open(request.principal, body)
        except SequenceConflict:
            return None
        except LogError as exc:
            raise JobError(503, "storage_unavailable", f"the job log failed: {exc}") from exc
        finally:
            for ref in inputs:
                self._unlogged[ref.digest] -= 1
        return writer, body

    async def _put(self, data: bytes, content_type: str) -> r.BlobRef:
        """A blob, marked as not yet named by any record until the caller logs it."""
        async with self._blob_lock:
            ref = await self.blobs.put(data, content_type)
            self._unlogged[ref.digest] += 1
        return ref

    async def _existing(self, stored: StoredJob, digest: str) -> JobRun:
        assert stored.job is not None
        _same_request(stored.job.request_digest, digest)
        running = self.runs.get(stored.job_id)
        if running is not None:
            return running
        if stored.result is None:
            raise JobError(
                409,
                "idempotency_key_in_progress",
                "a request with this Idempotency-Key is still running; retry later",
                "Idempotency-Key",
            )
        run = JobRun(stored.job_id, stored.job.request_digest, stored.owner or "")
        run.finish(await self._replay(stored))
        metrics.BATCH_JOBS.labels(stored.job.route, "replayed").inc()
        return run

    async def _replay(self, stored: StoredJob) -> Outcome:
        assert stored.result is not None and stored.job is not None
        kind = self.kinds.get(stored.job.route)
        content_type = kind.content_type(stored.job.params) if kind else "application/octet-stream"
        body = b""
        if stored.result.output is not None:
            try:
                body = await self.blobs.read(stored.result.output)
            except BlobMissing as exc:
                raise JobError(
                    500, "storage_unavailable", f"the job's stored result is gone ({exc})"
                ) from exc
            content_type = stored.result.output.content_type
        return outcome_of(stored, body, content_type, replayed=True)

    def _claim(self, run: JobRun) -> None:
        self.runs[run.job_id] = run
        self._per_key[run.principal] += 1
        metrics.BATCH_QUEUE_DEPTH.inc()

    def _forget(self, run: JobRun) -> None:
        if self.runs.get(run.job_id) is run:
            del self.runs[run.job_id]
            metrics.BATCH_QUEUE_DEPTH.dec()
            self._per_key[run.principal] -= 1
            if self._per_key[run.principal] <= 0:
                del self._per_key[run.principal]
        self._fences.pop(run.job_id, None)

    # --- running --------------------------------------------------------------

    def _start(self, run: JobRun, writer: JobWriter, job: r.JobBody, uploads: list[bytes]) -> None:
        """The job runs in its own task: a client that hangs up does not stop it."""
        self._fences[run.job_id] = writer.fence
        task = asyncio.get_running_loop().create_task(self._run(run, writer, job, uploads))
        self._tasks[run.job_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(run.job_id, None))

    async def _run(
        self, run: JobRun, writer: JobWriter, job: r.JobBody, uploads: list[bytes]
    ) -> None:
        kind = self.kinds[job.route]
        content_type = kind.content_type(job.params)

        async def progress(percent: int, detail: str = "") -> None:
            await writer.append(r.ProgressBody(max(0, min(100, percent)), detail))

        given = JobInput(run.job_id, job.params, uploads, progress, self.offload)
        self.executions += 1
        refs: list[r.BlobRef] = []
        started = time.monotonic()
        outcome = "cancelled"  # deleted, or the server shut down: it runs again at the next start
        try:
            result = await self._produce(run, kind, given, content_type)
            refs = [*([result.output] if result.output else []), *result.assets.values()]
            await writer.append(result, r.CloseBody("job_finished"))
            outcome = (
                result.status if result.status == "completed" else result.error_code or "failed"
            )
        except LogError as exc:
            # Left open in the log: the next start runs it again.
            log.error("job %s: result not recorded: %s", run.job_id, exc)
            outcome = "storage_unavailable"
            error = JobError(
                503, "storage_unavailable", f"the job's result was not recorded: {exc}"
            )
            run.finish(Outcome(run.job_id, "failed", 503, "", b"", {}, error, False))
            return
        finally:
            for ref in refs:
                self._unlogged[ref.digest] -= 1
            self._forget(run)
            metrics.BATCH_JOBS.labels(job.route, outcome).inc()
            metrics.BATCH_JOB_SECONDS.labels(job.route).observe(time.monotonic() - started)
        stored = StoredJob(run.job_id, run.principal, job, result, 100, True, writer.last_seq, 0)
        run.finish(outcome_of(stored, b"".join(run.chunks), content_type, replayed=False))

    async def _produce(
        self, run: JobRun, kind: JobKind, given: JobInput, content_type: str
    ) -> r.ResultBody:
        """The producer's body in the blob store, or the error it ended with."""
        try:
            size = 0
            async for chunk in kind.produce(given):
                size += len(chunk)
                if size > MAX_RESULT_BYTES:
                    raise JobError(
                        500, "result_too_large", f"the result passed {MAX_RESULT_BYTES} bytes"
                    )
                run.push(chunk)
        except JobError as exc:
            return _failure(exc, given)
        except Exception as exc:  # the job boundary: a producer's failure ends its job
            log.exception("job %s (%s) failed", run.job_id, kind.route)
            return _failure(JobError(500, "engine_error", f"the job failed: {exc}"), given)
        ref = await self._put(b"".join(run.chunks), content_type)
        assets = {
            name: await self._put(data, media) for name, (data, media) in given.assets.items()
        }
        metadata = json.dumps(given.metadata).encode()
        return r.ResultBody("completed", output=ref, metadata=metadata, assets=assets)

    # --- recovery, retention, leases -------------------------------------------

    async def recover(self) -> int:
        """Run again every open job nobody runs: those a previous process
        left unfinished, a dead replica's once its lease lapsed, one whose
        result the store refused; returns how many. Called at start and by
        housekeeping. Their runs are registered before this returns (a retry
        under their key waits for them), the work goes on in the background."""
        resumed = 0
        for row in await self.log.sessions(open_only=True):
            if not r.is_job_session(row.session_id) or row.session_id in self.runs:
                continue
            try:
                fence = await self.log.acquire_lease(row.session_id, self.settings.owner)
            except LeaseHeld:
                continue  # a live replica runs it
            records = await self.log.read(row.session_id)
            stored = StoredJob.of(row.session_id, records)
            writer = JobWriter(self.log, row.session_id, fence, stored.last_seq)
            if stored.job is None:
                await self.log.delete(row.session_id)  # died before it was asked anything
                continue
            if stored.result is not None:
                await writer.append(r.CloseBody("job_finished"))
                continue
            kind = self.kinds.get(stored.job.route)
            if kind is None:
                log.warning(
                    "job %s: no route %s here to finish it", stored.job_id, stored.job.route
                )
                continue
            try:
                uploads = [await self.blobs.read(ref) for ref in stored.job.inputs]
            except BlobMissing as exc:
                error = JobError(500, "storage_unavailable", f"the job's upload is gone ({exc})")
                await writer.append(_failure(error, None), r.CloseBody("job_finished"))
                continue
            run = JobRun(stored.job_id, stored.job.request_digest, stored.owner or "")
            self._claim(run)
            self._start(run, writer, stored.job, uploads)
            resumed += 1
        if resumed:
            log.info("resumed %d unfinished job(s)", resumed)
        return resumed

    async def recover_or_defer(self) -> None:
        """Recover at startup; if the store does not answer, housekeeping
        retries (a Redis outage must not keep the server down)."""
        try:
            await self.recover()
            self._recovery_pending = False
        except LogError as exc:
            log.error("job recovery deferred, the store is unavailable: %s", exc)
            self._recovery_pending = True

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._housekeeper = loop.create_task(self._housekeep_forever(), name=HOUSEKEEPING_TASK)
        self._index_build = loop.create_task(self.refresh_index())
        self._index_build.add_done_callback(_log_failure)

    async def _housekeep_forever(self) -> None:
        """Leases renewed (shared stores), orphaned jobs adopted (every lease
        period on a shared store, where a dead replica's jobs wait for its
        lease to lapse; every sweep otherwise), retention kept."""
        next_sweep = next_adopt = 0.0
        adopt_every = 3 * self.settings.lease_renew_s
        while True:
            await asyncio.sleep(self.settings.lease_renew_s if self.log.shared else 1.0)
            now = time.monotonic()
            try:
                if self.log.shared and self._fences:
                    await self.log.renew_leases(self.settings.owner, dict(self._fences))
                if self._recovery_pending or (self.log.shared and now >= next_adopt):
                    next_adopt = now + adopt_every
                    await self.recover_or_defer()
                    if self.log.shared and self._index_built():
                        await self.refresh_index()  # what the other replicas made
                if now >= next_sweep:
                    next_sweep = now + self.settings.sweep_interval_s
                    await self.recover()
                    await self.expire(int(time.time() * 1000))
            except LogError as exc:
                log.warning("job housekeeping skipped: %s", exc)

    async def expire(self, now_ms: int) -> list[str]:
        """Delete finished jobs older than the retention, then the blobs no
        job names any more (a blob no record ever named, after a grace)."""
        horizon = now_ms - self.settings.retention_s * 1000
        rows = [row for row in await self.log.sessions() if r.is_job_session(row.session_id)]
        doomed = [
            row.session_id
            for row in rows
            if row.closed and row.last_ts_ms < horizon and row.session_id not in self.runs
        ]
        freed: set[str] = set()
        for job_id in doomed:
            freed |= await self._delete_records(job_id)
        await self._delete_blobs(freed, sweep=True)
        return doomed

    async def _delete_records(self, job_id: str) -> set[str]:
        """Delete a job's log; returns the digests of the blobs it named."""
        self.index.remove(job_id)
        self._examined.discard(job_id)
        try:
            named = {
                ref.digest for ref in StoredJob.of(job_id, await self.log.read(job_id)).blobs()
            }
        except UnknownSession:
            return set()
        await self.log.delete(job_id)
        return named

    async def _delete_blobs(self, freed: set[str], *, sweep: bool = False) -> None:
        """Delete the ``freed`` blobs no remaining job names (content-addressed
        blobs are shared by jobs that made the same bytes); ``sweep``: also
        every blob nobody named for longer than the grace."""
        keep: set[str] = set()
        for row in await self.log.sessions():
            if r.is_job_session(row.session_id):
                with contextlib.suppress(UnknownSession):
                    records = await self.log.read(row.session_id)
                    keep.update(ref.digest for ref in StoredJob.of(row.session_id, records).blobs())
        async with self._blob_lock:
            keep.update(digest for digest, count in self._unlogged.items() if count > 0)
            await asyncio.to_thread(self.blobs.delete_sync, freed - keep)
            if sweep:
                await asyncio.to_thread(self.blobs.sweep_sync, keep, ORPHAN_BLOB_GRACE_S)

    # --- asynchronous jobs: what a client that polls may ask --------------------

    async def job(self, principal: str, job_id: str) -> StoredJob | None:
        """A job as its records tell it, if it is ``principal``'s (None: no
        such job, or another principal's: the caller answers 404 for both)."""
        if not r.is_job_session(job_id):
            return None
        try:
            stored = StoredJob.of(job_id, await self.log.read(job_id))
        except UnknownSession:
            return None
        if stored.job is None or stored.owner != principal:
            return None
        return stored

    async def listing(
        self, principal: str, route: str, after: str | None, limit: int, descending: bool
    ) -> Page:
        """A page of ``principal``'s jobs on a listed ``route`` from the index
        (no job's log is read); waits for the index's first build."""
        if not self._index_built():
            if self._index_build is None or self._index_build.done():  # not begun, or failed
                self._index_build = asyncio.get_running_loop().create_task(self.refresh_index())
            try:
                await asyncio.shield(self._index_build)
            except LogError as exc:
                raise JobError(503, "storage_unavailable", f"the job log failed: {exc}") from exc
        return self.index.page(principal, route, after, limit, descending)

    def unlisted(self, job_id: str) -> None:
        """A listed job found gone from the log (deleted by another replica)."""
        self.index.remove(job_id)
        self._examined.discard(job_id)

    def _index_built(self) -> bool:
        build = self._index_build
        if build is None or not build.done() or build.cancelled():
            return False
        return build.exception() is None

    async def refresh_index(self) -> None:
        """Bring the index up to the log: index the job sessions not looked at
        yet (reading each once), forget those no longer there. At start it
        reads every job once; later (shared stores) only the new ones."""
        before = set(self._examined)
        rows = await self.log.sessions()
        present = {row.session_id for row in rows if r.is_job_session(row.session_id)}
        for gone in before - present:
            self.unlisted(gone)
        for job_id in present - self._examined:
            try:
                stored = StoredJob.of(job_id, await self.log.read(job_id))
            except UnknownSession:
                continue
            if stored.job is None or stored.owner is None:
                continue  # still being opened: looked at again next time
            self._examined.add(job_id)
            self.index.add(job_id, stored.owner, stored.job.route, stored.created_ms)

    async def output_path(self, stored: StoredJob) -> Path:
        """A finished job's body as its checked blob file (to stream)."""
        if stored.result is None or stored.result.output is None:
            raise JobError(404, "job_not_finished", f"job {stored.job_id} has no output yet")
        try:
            return await self.blobs.verified_path(stored.result.output)
        except BlobMissing as exc:
            raise JobError(500, "storage_unavailable", f"the job's output is gone ({exc})") from exc

    async def asset_path(self, stored: StoredJob, name: str) -> Path:
        """A finished job's asset ``name`` as its checked blob file (to stream)."""
        ref = stored.result.assets.get(name) if stored.result is not None else None
        if ref is None:
            raise JobError(
                404,
                "asset_not_found",
                f"job {stored.job_id} stored no {name} (made before the server kept one?)",
                "variant",
            )
        try:
            return await self.blobs.verified_path(ref)
        except BlobMissing as exc:
            raise JobError(500, "storage_unavailable", f"the job's {name} is gone ({exc})") from exc

    async def delete(self, principal: str, job_id: str) -> bool:
        """Stop the job if it runs (its requesters get 404 ``job_deleted``)
        and delete its log and the blobs nobody else names; False if there
        is no such job of ``principal``'s."""
        if await self.job(principal, job_id) is None:
            return False
        task = self._tasks.get(job_id)
        run = self.runs.get(job_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if run is not None:
            self._forget(run)
            error = JobError(404, "job_deleted", f"job {job_id} was deleted")
            run.finish(Outcome(job_id, "failed", 404, "", b"", {}, error, False))
        await self._delete_blobs(await self._delete_records(job_id))
        return True

    async def shutdown(self) -> None:
        """Jobs still running stay open in the log: the next start finishes them."""
        if self._index_build is not None:
            self._index_build.cancel()
            with contextlib.suppress(asyncio.CancelledError, LogError):  # a failure is logged
                await self._index_build
        tasks = [t for t in (self._housekeeper, *self._tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._cpu.shutdown(wait=False, cancel_futures=True)


def _log_failure(task: asyncio.Task[None]) -> None:
    """The index's first build failed (the store did not answer): the next
    listing builds it again."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("job index not built yet: %s", task.exception())


def _failure(exc: JobError, given: JobInput | None) -> r.ResultBody:
    metadata = json.dumps(given.metadata if given else {}).encode()
    return r.ResultBody(
        "failed",
        http_status=exc.status,
        metadata=metadata,
        error_code=exc.code,
        error_message=exc.message,
        error_param=exc.param,
    )


def _same_request(stored_digest: str, digest: str) -> None:
    if stored_digest != digest:
        raise JobError(
            422,
            "idempotency_key_reused",
            "this Idempotency-Key was used with another request; send the same request "
            "to get its result, or use a new key",
            "Idempotency-Key",
        )


def check_idempotency_key(key: str) -> None:
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS or not key.isprintable():
        raise JobError(
            400,
            "invalid_value",
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} printable characters",
            "Idempotency-Key",
        )
