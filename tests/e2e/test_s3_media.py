"""A real server with ``--media-dir s3://bucket/prefix`` (issue 41): while a
client streams, the session's audio goes to a real S3-compatible server
(moto's, on a local port) in sealed segments, configured only by boto3's
own environment variables; after a clean stop Redis holds references only,
and another replica's client reads every appended chunk back byte for byte."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import boto3
import pytest
import redis as redis_client

from duplex_server.jobs.s3_blobs import S3Blobs
from duplex_server.sessions.core.records import AudioBody
from duplex_server.sessions.log.redis_store import RedisLog
from tests.e2e.serverproc import ROOT, ServerProcess
from tests.test_s3_media import BUCKET, s3_env, s3_server
from tests.wsclient import WsClient

CHUNK_BYTES = 4800  # 100 ms of 24 kHz pcm16
APPENDS = 120  # about two segments' worth (256 KiB each) while it streams


def _chunk(n: int) -> bytes:
    return bytes((n * 7 + i) % 251 for i in range(CHUNK_BYTES))


@pytest.fixture
def s3(tmp_path, monkeypatch):
    with s3_server() as endpoint:
        for name, value in s3_env(endpoint, tmp_path).items():
            monkeypatch.setenv(name, value)  # the server process inherits them
        yield boto3.client("s3")


async def _stream(server: ServerProcess) -> str:
    client = await WsClient.connect(server.ws_url)
    created = await client.expect("session.created")
    await client.send({"type": "session.update", "session": {"turn_detection": None}})
    await client.recv_until("session.updated")
    for n in range(APPENDS):
        await client.append(_chunk(n), event_id=f"a{n}")
        if n % 10 == 9:
            await client.send({"type": "session.heartbeat"})
            await client.recv_until("session.heartbeat_ack")
        await asyncio.sleep(0.01)
    await client.close()
    return created["session"]["id"]


def _objects(s3, prefix: str, *, at_least: int, wait_s: float) -> list[str]:
    deadline = time.monotonic() + wait_s
    while True:
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/").get("Contents", [])
        if len(listed) >= at_least or time.monotonic() > deadline:
            return [o["Key"] for o in listed]
        time.sleep(0.1)


async def test_a_server_keeps_a_sessions_audio_in_the_object_store(redis_server, s3):
    redis_prefix, media_prefix = (f"{c}{uuid.uuid4().hex[:10]}" for c in "rm")
    location = f"s3://{BUCKET}/{media_prefix}"
    server = ServerProcess(redis_server.url, redis_prefix=redis_prefix, media_dir=location)
    server.start()
    try:
        session_id = await _stream(server)
        # sealed as the audio came, not only at the stop
        assert _objects(s3, media_prefix, at_least=2, wait_s=5.0)[1:], server.log_text()
    finally:
        server.stop()
    # a clean stop (uvicorn re-raises the SIGTERM it handled), not stop()'s SIGKILL
    assert server.proc is not None and server.proc.returncode in (0, -signal.SIGTERM)
    assert not (ROOT / "s3:").exists()  # not taken for a folder named "s3:"

    bulk = redis_client.Redis.from_url(redis_server.url).hkeys(
        f"{redis_prefix}:{{{session_id}}}:bulk"
    )
    assert bulk and all(name[:1] in b"AOU" for name in bulk), sorted(bulk)[:4]
    replica = RedisLog(redis_server.url, prefix=redis_prefix, media=S3Blobs(location))
    try:
        records = await replica.read(session_id)
    finally:
        await replica.close()
    audio = {r.event_id: r.body.pcm for r in records if isinstance(r.body, AudioBody)}
    assert audio == {f"a{n}": _chunk(n) for n in range(APPENDS)}
