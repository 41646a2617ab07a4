"""The job framework under the speech route: retention deletes a finished
job's log and its blobs (a retry after that runs again), blobs nobody names
are swept, half-written blobs never stay, and one key cannot fill the server."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid

import msgspec
import openai
import pytest

from batch_api.speech import ROUTE, SpeechRequest
from duplex_server.jobs.blobs import BlobStore
from duplex_server.jobs.run import JobRequest
from duplex_server.sessions.core import records as r
from tests.batch_helpers import batch_server, blob_files, client

TEXT = "Results are kept for a while, then they go."


async def job_ids(server) -> list[str]:
    return [
        s.session_id
        for s in await server.app.state.log.sessions()
        if r.is_job_session(s.session_id)
    ]


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_retention_deletes_the_job_and_its_blob_and_a_retry_runs_again(tmp_path, store):
    spec = "memory" if store == "memory" else f"sqlite:{tmp_path / 's.db'}"
    async with batch_server(
        spec, blob_dir=str(tmp_path / "blobs"), batch_retention_s=3600
    ) as server:
        runner = server.app.state.batch.runner
        headers = {"Idempotency-Key": "keep-me-a-while"}
        first = await client(server).audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT, extra_headers=headers
        )
        (job_id,) = await job_ids(server)
        assert len(blob_files(server)) == 1
        now_ms = int(time.time() * 1000)
        assert await runner.expire(now_ms) == []  # within the retention: kept
        assert await job_ids(server) == [job_id]
        assert await runner.expire(now_ms + 3601 * 1000) == [job_id]
        assert await job_ids(server) == []
        assert blob_files(server) == []
        executions = runner.executions
        again = await client(server).audio.speech.with_raw_response.create(
            model="tts-1", voice="alloy", input=TEXT, extra_headers=headers
        )
        assert runner.executions == executions + 1 and "idempotent-replayed" not in again.headers
        assert again.content[:3] == first.content[:3] == b"ID3"


async def test_the_housekeeper_expires_results_on_its_own(tmp_path):
    async with batch_server(
        "memory", blob_dir=str(tmp_path / "blobs"), batch_retention_s=0.5
    ) as server:
        await client(server).audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        assert len(await job_ids(server)) == 1
        for _ in range(300):  # the sweep runs every second here
            if not await job_ids(server) and not blob_files(server):
                break
            await asyncio.sleep(0.1)
        assert await job_ids(server) == [] and blob_files(server) == []


async def test_a_blob_no_record_names_is_swept_after_the_grace(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        runner = server.app.state.batch.runner
        await client(server).audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        named = blob_files(server)
        orphan = await server.app.state.batch.blobs.put(b"written, then the process died", "x/y")
        path = server.app.state.batch.blobs.path(orphan.digest)
        await runner.expire(int(time.time() * 1000))
        assert path.exists()  # young: its record may be on the way
        old = time.time() - 2 * 3600
        os.utime(path, (old, old))
        await runner.expire(int(time.time() * 1000))
        assert not path.exists() and blob_files(server) == named


def test_a_half_written_blob_never_stays(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    (tmp_path / "blobs" / "tmp" / "tmpabc123").write_bytes(b"half of some")
    ref = store.put_sync(b"whole", "text/plain")
    assert store.read_sync(ref) == b"whole" and ref.size == 5
    reopened = BlobStore(tmp_path / "blobs")  # as after a crash
    assert list((tmp_path / "blobs" / "tmp").iterdir()) == []
    assert [d for d, _ in reopened.digests()] == [ref.digest]


async def test_one_key_cannot_hold_more_jobs_than_its_limit(tmp_path):
    long_text = "A long text keeps the synthesiser busy for a while. " * 60
    async with batch_server(
        "memory", blob_dir=str(tmp_path / "blobs"), batch_max_jobs_per_key=1
    ) as server:
        sdk = client(server)
        first = asyncio.create_task(
            sdk.audio.speech.create(model="tts-1", voice="alloy", input=long_text)
        )
        while not server.app.state.batch.runner.runs:
            await asyncio.sleep(0.005)
        with pytest.raises(openai.RateLimitError) as refused:
            await sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        assert refused.value.body["code"] == "too_many_jobs"  # type: ignore[index]
        assert (await first).content
        # the slot is free again once the first job has finished
        assert (await sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)).content


async def leave_a_job_unfinished(store_spec: str, tmp_path, **config) -> str:
    """The records a process writes before it dies mid-job: asked, never answered."""
    from duplex_server.app import open_store
    from duplex_server.config import ServerConfig
    from duplex_server.jobs.journal import JobWriter, keyed_job_id

    log = open_store(ServerConfig(store=store_spec, **config))
    job_id = keyed_job_id("anonymous", "left-behind")
    asked = SpeechRequest(model="tts-1", input=TEXT, voice="alloy", response_format="wav")
    params = msgspec.json.encode(asked)  # as the route stores it
    request = JobRequest("/v1/audio/speech", "anonymous", params, "left-behind")
    await log.create(job_id)
    fence = await log.acquire_lease(job_id, "a-replica-that-died")
    await JobWriter(log, job_id, fence).open(
        "anonymous", r.JobBody(request.route, params, request.digest(), "left-behind")
    )
    await log.close()
    return job_id


@pytest.mark.parametrize("store", ["sqlite", "redis"])
async def test_a_job_a_dead_process_left_is_finished_by_the_next(request, tmp_path, store):
    if store == "redis":
        spec = request.getfixturevalue("redis_server").url
        config = {"redis_prefix": f"t{uuid.uuid4().hex[:12]}", "lease_ttl_ms": 600}
    else:
        spec, config = f"sqlite:{tmp_path / 's.db'}", {}
    job_id = await leave_a_job_unfinished(spec, tmp_path, **config)
    async with batch_server(spec, blob_dir=str(tmp_path / "blobs"), **config) as server:
        # On Redis the dead replica's lease must lapse first: the runner adopts
        # the job on a later round; on SQLite it runs it at start.
        for _ in range(300):
            kinds = [rec.kind for rec in await server.app.state.log.read(job_id)]
            if "close" in kinds:
                break
            await asyncio.sleep(0.05)
        assert kinds == ["config", "job", "result", "close"]
        retry = await client(server).audio.speech.with_raw_response.create(
            model="tts-1",
            voice="alloy",
            input=TEXT,
            response_format="wav",
            extra_headers={"Idempotency-Key": "left-behind"},
        )
        assert retry.headers["idempotent-replayed"] == "true"
        assert retry.headers["x-duplex-job-id"] == job_id
        assert retry.content[:4] == b"RIFF"


async def test_a_polling_client_reads_its_jobs_and_deletes_them(tmp_path):
    """What asynchronous routes (videos) build on: a job by id, a
    principal's jobs of a listed route (speech made one here), the output,
    deletion (also mid-run)."""
    long_text = "A long text keeps the synthesiser busy for a while. " * 60
    async with batch_server(f"sqlite:{tmp_path / 's.db'}") as server:
        runner = server.app.state.batch.runner
        runner.register(dataclasses.replace(runner.kinds[ROUTE], listed=True))
        sdk = client(server)
        done = await sdk.audio.speech.with_raw_response.create(
            model="tts-1", voice="alloy", input=TEXT
        )
        job_id = done.headers["x-duplex-job-id"]
        stored = await runner.job("anonymous", job_id)
        assert stored is not None and stored.result is not None and stored.closed
        assert (await runner.output_path(stored)).read_bytes() == done.content
        assert await runner.job("someone-else", job_id) is None
        assert await runner.job("anonymous", "sess_not_a_job") is None

        running = asyncio.create_task(
            sdk.audio.speech.create(model="tts-1", voice="alloy", input=long_text)
        )
        while len(runner.runs) < 1:
            await asyncio.sleep(0.005)
        (running_id,) = runner.runs
        while await runner.job("anonymous", running_id) is None:  # its request not logged yet
            await asyncio.sleep(0.005)
        listed = await runner.listing("anonymous", ROUTE, None, 10, descending=False)
        assert listed.job_ids == [job_id, running_id] and not listed.has_more
        newest = await runner.listing("anonymous", ROUTE, None, 1, descending=True)
        assert newest.job_ids == [running_id] and newest.has_more
        older = await runner.listing("anonymous", ROUTE, running_id, 1, descending=True)
        assert older.job_ids == [job_id] and not older.has_more
        assert (await runner.listing("someone-else", ROUTE, None, 10, False)).job_ids == []
        assert (await runner.listing("anonymous", "/v1/videos", None, 10, False)).job_ids == []

        assert await runner.delete("anonymous", running_id)
        with pytest.raises(openai.NotFoundError) as deleted:
            await running
        assert deleted.value.body["code"] == "job_deleted"  # type: ignore[index]
        assert await runner.delete("anonymous", job_id)
        assert await job_ids(server) == [] and blob_files(server) == []
        assert not await runner.delete("anonymous", job_id)
        assert len(runner.index) == 0


async def test_realtime_speech_goes_ahead_of_queued_batch_clauses(tmp_path):
    """Batch jobs wait at the TTS stage behind a live session's clause:
    with the stage busy and three speech jobs' clauses queued, a realtime
    synthesis queued after them runs first."""
    import threading

    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        stages = server.app.state.model.listening
        engine = stages.tts_stage.engine
        gate = threading.Event()
        blocker = asyncio.create_task(stages.tts_stage.run(gate.wait))
        while engine.running < 1:
            await asyncio.sleep(0.005)
        sdk = client(server)
        jobs = [
            asyncio.create_task(sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT))
            for _ in range(3)
        ]
        while engine.queued < 3:
            await asyncio.sleep(0.005)
        speech = server.app.state.batch.audio.speech
        batch_clauses_before_realtime = []

        def realtime_clause() -> bytes:
            batch_clauses_before_realtime.append(speech.runs)
            return stages.tts.synthesize("You said good morning.", "en-us+f3", 1.0)

        realtime = asyncio.create_task(stages.tts_stage.run(realtime_clause))
        while engine.queued < 4:
            await asyncio.sleep(0.005)
        gate.set()
        await asyncio.gather(blocker, realtime, *jobs)
        assert batch_clauses_before_realtime == [0]
        assert speech.runs >= 3  # and then every job's clauses


async def test_a_stream_that_fails_midway_says_so(tmp_path):
    """A job that fails after its first bytes: an SSE stream ends with an
    error event, any other body is cut off; the failure is the job's result."""
    from batch_api.http import StreamBroken, streamed
    from duplex_server.jobs.run import JobError, JobInput, JobKind
    from duplex_server.jobs.runner import JobRunner, RunnerSettings
    from duplex_server.sessions.log.memory_store import MemoryLog

    async def half_then_fail(given: JobInput):
        yield b"first half"
        raise JobError(500, "engine_error", "the synthesiser crashed")

    log = MemoryLog()
    runner = JobRunner(log, BlobStore(tmp_path / "blobs"), RunnerSettings(owner="here"))
    runner.register(JobKind("/test", half_then_fail, lambda params: "audio/pcm"))
    for sse, key in ((True, "a"), (False, "b")):
        run = await runner.submit(JobRequest("/test", "me", b"{}", key))
        got = []
        if sse:
            got = [chunk async for chunk in streamed(run, sse=True)]
            assert got[0] == b"first half"
            assert got[-1].startswith(b'data: {"type": "error"') and b"engine_error" in got[-1]
        else:
            with pytest.raises(StreamBroken):
                async for chunk in streamed(run, sse=False):
                    got.append(chunk)
            assert got == [b"first half"]
        stored = await runner.job("me", run.job_id)
        assert stored is not None and stored.result is not None
        assert (stored.result.status, stored.result.error_code) == ("failed", "engine_error")
    assert [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()] == []


async def test_the_realtime_manager_leaves_job_sessions_alone(tmp_path):
    """Its purge (another retention), orphan expiry and recovery never touch
    a job session: the job runner keeps them."""
    long_text = "A long text keeps the synthesiser busy for a while. " * 30
    async with batch_server(f"sqlite:{tmp_path / 's.db'}", retention_s=1) as server:
        manager = server.manager
        sdk = client(server)
        await sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        (finished,) = await job_ids(server)
        running = asyncio.create_task(
            sdk.audio.speech.create(model="tts-1", voice="alloy", input=long_text)
        )
        while not server.app.state.batch.runner.runs:
            await asyncio.sleep(0.005)
        far = int(time.time() * 1000) + 10 * 24 * 3600 * 1000
        assert finished not in await manager.purge(far)
        assert await manager.expire_orphans(far) == []
        assert await manager.recover() == 0
        assert not [sid for sid in manager.actors if r.is_job_session(sid)]
        assert (await running).content
        assert len(await job_ids(server)) == 2
