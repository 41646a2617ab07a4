"""A video job in the middle of its denoising when the server is killed
with SIGKILL is run again after the restart and completes: the job is a
session on the log (SQLite here), its request a record."""

from __future__ import annotations

import asyncio
import io

import av
import httpx
import pytest

from duplex_server.sessions.log.sqlite_store import SqliteReader
from duplex_server.sessions.log.store import UnknownSession
from tests.e2e.serverproc import ServerProcess
from tests.tiny_diffusion import tiny_video_pipeline

BODY = {"prompt": "a slow river", "size": "16x16", "seconds": "4", "fps": 2}


@pytest.fixture(scope="module")
def video_model(tmp_path_factory) -> str:
    return str(tiny_video_pipeline(tmp_path_factory.mktemp("tiny-animatediff")))


def records(db, job_id: str) -> list:
    try:
        return list(SqliteReader(str(db)).records(job_id))
    except UnknownSession:
        return []


async def wait_until_denoising(db, job_id: str) -> None:
    """Until the job has logged a step's progress: it is mid-run."""
    for _ in range(4000):
        if any(rec.kind == "progress" and rec.body.percent > 0 for rec in records(db, job_id)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the job never started denoising")


async def test_a_video_killed_mid_run_completes_after_restart(tmp_path, video_model):
    db = tmp_path / "jobs.db"

    def server() -> ServerProcess:
        return ServerProcess(f"sqlite:{db}", model="echo", video_model=video_model)

    first = server().start()
    try:
        async with httpx.AsyncClient(base_url=first.http_url, timeout=120) as http:
            created = await http.post(
                "/v1/videos", json={**BODY, "num_inference_steps": 30, "seed": 9}
            )
            assert created.status_code == 200, created.text
            job_id = created.json()["id"]
            await wait_until_denoising(db, job_id)
            first.kill9()
    finally:
        first.stop()
    kinds = [rec.kind for rec in records(db, job_id)]
    assert "result" not in kinds and kinds[:2] == ["config", "job"]

    restarted = server().start()
    try:
        async with httpx.AsyncClient(base_url=restarted.http_url, timeout=120) as http:
            for _ in range(2400):
                video = (await http.get(f"/v1/videos/{job_id}")).json()
                if video["status"] in ("completed", "failed"):
                    break
                await asyncio.sleep(0.1)
            assert video["status"] == "completed", video
            content = await http.get(f"/v1/videos/{job_id}/content")
    finally:
        restarted.stop()
    with av.open(io.BytesIO(content.content)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 8
    kinds = [rec.kind for rec in records(db, job_id)]
    assert kinds[-2:] == ["result", "close"] and kinds.count("result") == 1
