"""Job sessions through a real server process: a speech job in flight when
the server is killed with SIGKILL is run again after the restart and its
result is what a retry under the same Idempotency-Key gets; ``duplex-server
inspect`` shows the job's records."""

from __future__ import annotations

import asyncio

import httpx

from duplex_server.audio.containers import decode
from duplex_server.jobs.journal import keyed_job_id
from duplex_server.sessions.log.sqlite_store import SqliteReader
from duplex_server.sessions.log.store import UnknownSession
from tests.e2e.serverproc import ServerProcess, run_cli

SENTENCE = "The quick brown fox jumps over the lazy dog, and then it rests a while. "
LONG_TEXT = (SENTENCE * 55)[:4000]
KEY = "crash-test-1"


def kinds(db, job_id: str) -> list[str]:
    try:
        return [record.kind for record in SqliteReader(str(db)).records(job_id)]
    except UnknownSession:
        return []


async def wait_for_job_record(db, job_id: str) -> None:
    """Until the job's request is in the log (it is running from then on)."""
    for _ in range(2000):
        if "job" in kinds(db, job_id):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the job never reached the log")


def speech_server(db) -> ServerProcess:
    return ServerProcess(f"sqlite:{db}", model="cascade", asr="pocketsphinx")


async def test_a_job_killed_mid_run_finishes_after_restart(tmp_path):
    db = tmp_path / "jobs.db"
    job_id = keyed_job_id("anonymous", KEY)
    body = {"model": "tts-1", "voice": "alloy", "input": LONG_TEXT, "response_format": "wav"}
    headers = {"Idempotency-Key": KEY}
    server = speech_server(db).start()
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            request = asyncio.create_task(
                http.post(f"{server.http_url}/v1/audio/speech", json=body, headers=headers)
            )
            await wait_for_job_record(db, job_id)
            server.kill9()
            try:
                await request
            except httpx.HTTPError:
                pass  # the connection died with the server
            else:
                raise AssertionError("the request finished before the kill")
    finally:
        server.stop()
    assert kinds(db, job_id) == ["config", "job"]  # asked, never answered

    restarted = speech_server(db).start()
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            retry = await http.post(
                f"{restarted.http_url}/v1/audio/speech", json=body, headers=headers
            )
            assert retry.status_code == 200, retry.text
            assert retry.headers["x-duplex-job-id"] == job_id
            # recovered as a job, never as a realtime session waiting for its client
            realtime = await http.get(f"{restarted.http_url}/v1/sessions/{job_id}")
            assert realtime.status_code == 404
            again = await http.post(
                f"{restarted.http_url}/v1/audio/speech", json=body, headers=headers
            )
    finally:
        restarted.stop()
    audio_s = len(decode(retry.content, 24_000, 600)) / 2 / 24_000
    assert audio_s > 120  # the whole 4,000 characters were spoken, not a part
    assert again.content == retry.content and again.headers["idempotent-replayed"] == "true"
    assert kinds(db, job_id) == ["config", "job", "result", "close"]  # run once, after the restart

    shown = run_cli("duplex_server.cli", "inspect", str(db), job_id)
    assert shown.returncode == 0, shown.stderr
    assert "/v1/audio/speech" in shown.stdout and f"key='{KEY}'" in shown.stdout
    assert "completed 200 output=sha256:" in shown.stdout
    assert f"{len(retry.content)} bytes audio/wav" in shown.stdout
    listing = run_cli("duplex_server.cli", "inspect", str(db))
    assert job_id in listing.stdout
    blobs = [p for p in (tmp_path / "jobs.db.blobs").rglob("*") if p.is_file()]
    assert [p.stat().st_size for p in blobs] == [len(retry.content)]
