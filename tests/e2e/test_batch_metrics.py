"""Batch jobs on /metrics: every job the runner ends is counted by route and
outcome and timed, a replay from the log is counted as one without running,
and the queue-depth gauge holds the jobs admitted and not yet finished."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from duplex_server.jobs.run import JobError, JobInput, JobKind, JobRequest
from tests.batch_helpers import batch_server, client
from tests.scrape import grew, scrape, value

JOBS = "duplex_batch_jobs"
SECONDS = "duplex_batch_job_seconds"
DEPTH = "duplex_batch_queue_depth"
GATED = "/test/gated"
REFUSED = "/test/refused"


async def test_jobs_are_counted_timed_and_queued(tmp_path):
    gate = asyncio.Event()
    began = asyncio.Event()

    async def gated(given: JobInput) -> AsyncIterator[bytes]:
        began.set()
        await gate.wait()
        yield b"done"

    async def refused(given: JobInput) -> AsyncIterator[bytes]:
        raise JobError(400, "invalid_value", "no", "input")
        yield b""  # pragma: no cover - makes it a generator

    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        runner = server.app.state.batch.runner
        runner.register(JobKind(GATED, gated, lambda _: "text/plain"))
        runner.register(JobKind(REFUSED, refused, lambda _: "text/plain"))
        before = await scrape(server.http_url)

        run = await runner.submit(JobRequest(GATED, "tester", b"{}"))
        await began.wait()
        during = await scrape(server.http_url)
        gate.set()
        assert (await run.wait()).status == "completed"
        failed = await runner.submit(JobRequest(REFUSED, "tester", b"{}"))
        assert (await failed.wait()).status == "failed"

        headers = {"Idempotency-Key": "metrics-1"}
        for _ in range(2):  # run once, then answered from the log
            await client(server).audio.speech.create(
                model="tts-1", voice="alloy", input="Counted.", extra_headers=headers
            )
        after = await scrape(server.http_url)

    assert value(during, DEPTH, DEPTH) == value(before, DEPTH, DEPTH) + 1
    assert value(after, DEPTH, DEPTH) == value(before, DEPTH, DEPTH)
    total = f"{JOBS}_total"
    assert grew(before, after, JOBS, total, route=GATED, outcome="completed") == 1
    assert grew(before, after, JOBS, total, route=REFUSED, outcome="invalid_value") == 1
    speech = "/v1/audio/speech"
    assert grew(before, after, JOBS, total, route=speech, outcome="completed") == 1
    assert grew(before, after, JOBS, total, route=speech, outcome="replayed") == 1
    for route in (GATED, REFUSED, speech):
        assert grew(before, after, SECONDS, f"{SECONDS}_count", route=route) == 1, route
    assert grew(before, after, SECONDS, f"{SECONDS}_sum", route=GATED) > 0
