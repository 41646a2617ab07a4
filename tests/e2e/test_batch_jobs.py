"""Job sessions through a real server process: a speech job in flight when
the server is killed with SIGKILL is run again after the restart and its
result is what a retry under the same Idempotency-Key gets; ``duplex-server
inspect`` shows the job's records."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from duplex_server.audio.containers import decode
from duplex_server.jobs.journal import keyed_job_id
from duplex_server.sessions.log.redis_store import RedisLog
from duplex_server.sessions.log.sqlite_store import SqliteReader
from duplex_server.sessions.log.store import UnknownSession
from tests.e2e.serverproc import ServerProcess, run_cli

SENTENCE = "The quick brown fox jumps over the lazy dog, and then it rests a while. "
LONG_TEXT = (SENTENCE * 55)[:4000]
KEY = "crash-test-1"


class Store:
    """The test's view of the server's store: SQLite read-only beside it, or
    the same Redis under the server's prefix."""

    def __init__(self, kind: str, tmp_path, redis_url: str | None) -> None:
        self.kind = kind
        self.db = tmp_path / "jobs.db"
        self.blob_dir = tmp_path / ("jobs.db.blobs" if kind == "sqlite" else "blobs")
        self.prefix = f"t{uuid.uuid4().hex[:12]}"
        self.redis_url = redis_url

    def server(self) -> ServerProcess:
        if self.kind == "sqlite":
            return ServerProcess(f"sqlite:{self.db}", model="cascade", asr="pocketsphinx")
        return ServerProcess(
            self.redis_url,
            model="cascade",
            asr="pocketsphinx",
            redis_prefix=self.prefix,
            blob_dir=self.blob_dir,
            lease_ttl_ms=1000,
        )

    async def kinds(self, job_id: str) -> list[str]:
        if self.kind == "sqlite":
            try:
                return [record.kind for record in SqliteReader(str(self.db)).records(job_id)]
            except UnknownSession:
                return []
        log = RedisLog(self.redis_url, prefix=self.prefix)
        try:
            return [record.kind for record in await log.read(job_id)]
        except UnknownSession:
            return []
        finally:
            await log.close()


async def wait_for_job_record(store: Store, job_id: str) -> None:
    """Until the job's request is in the log (it is running from then on)."""
    for _ in range(2000):
        if "job" in await store.kinds(job_id):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the job never reached the log")


async def post_until_answered(http: httpx.AsyncClient, url: str, body: dict, headers: dict):
    """On Redis the restarted replica adopts the job once the dead one's
    lease lapses; until then a retry is told the key is still in progress."""
    for _ in range(120):
        reply = await http.post(url, json=body, headers=headers)
        if reply.status_code != 409:
            return reply
        assert reply.json()["error"]["code"] == "idempotency_key_in_progress"
        await asyncio.sleep(0.25)
    raise AssertionError("the job was never adopted")


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path) -> Store:
    redis_url = request.getfixturevalue("redis_server").url if request.param == "redis" else None
    return Store(request.param, tmp_path, redis_url)


async def test_a_job_killed_mid_run_finishes_after_restart(store):
    job_id = keyed_job_id("anonymous", KEY)
    body = {"model": "tts-1", "voice": "alloy", "input": LONG_TEXT, "response_format": "wav"}
    headers = {"Idempotency-Key": KEY}
    server = store.server().start()
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            request = asyncio.create_task(
                http.post(f"{server.http_url}/v1/audio/speech", json=body, headers=headers)
            )
            await wait_for_job_record(store, job_id)
            server.kill9()
            try:
                await request
            except httpx.HTTPError:
                pass  # the connection died with the server
            else:
                raise AssertionError("the request finished before the kill")
    finally:
        server.stop()
    assert await store.kinds(job_id) == ["config", "job"]  # asked, never answered

    restarted = store.server().start()
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            url = f"{restarted.http_url}/v1/audio/speech"
            retry = await post_until_answered(http, url, body, headers)
            assert retry.status_code == 200, retry.text
            assert retry.headers["x-duplex-job-id"] == job_id
            # recovered as a job, never as a realtime session waiting for its client
            realtime = await http.get(f"{restarted.http_url}/v1/sessions/{job_id}")
            assert realtime.status_code == 404
            again = await http.post(url, json=body, headers=headers)
    finally:
        restarted.stop()
    audio_s = len(decode(retry.content, 24_000, 600)) / 2 / 24_000
    assert audio_s > 120  # the whole 4,000 characters were spoken, not a part
    assert again.content == retry.content and again.headers["idempotent-replayed"] == "true"
    kinds = await store.kinds(job_id)
    assert kinds == ["config", "job", "result", "close"]  # run once, after the restart
    blobs = [p for p in store.blob_dir.rglob("*") if p.is_file()]
    assert [p.stat().st_size for p in blobs] == [len(retry.content)]
    if store.kind != "sqlite":
        return  # inspect reads SQLite files
    shown = run_cli("duplex_server.cli", "inspect", str(store.db), job_id)
    assert shown.returncode == 0, shown.stderr
    assert "/v1/audio/speech" in shown.stdout and f"key='{KEY}'" in shown.stdout
    assert "completed 200 output=sha256:" in shown.stdout
    assert f"{len(retry.content)} bytes audio/wav" in shown.stdout
    listing = run_cli("duplex_server.cli", "inspect", str(store.db))
    assert job_id in listing.stdout
