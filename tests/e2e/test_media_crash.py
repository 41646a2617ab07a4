"""Audio out of the store survives kill -9 (issue 41): a real server on a
real Redis, or on SQLite, with ``--media-dir`` seals each session's audio
into segment files a few seconds at a time while a client streams; killed
with SIGKILL wherever that leaves it (mid-segment, between a segment and its
swap, after it), the restarted server reads the session back whole, every
appended chunk byte for byte, and then moves what was left in the store out
to segments too."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid

import redis as redis_client

from duplex_server.app import open_media
from duplex_server.jobs.blobs import BlobStore
from duplex_server.sessions.core.records import AudioBody
from duplex_server.sessions.log.redis_store import RedisLog
from duplex_server.sessions.log.sqlite_store import SqliteLog
from tests.e2e.serverproc import ServerProcess
from tests.wsclient import WsClient

CHUNK_BYTES = 4800  # 100 ms of 24 kHz pcm16
# Killed after this many appends: each run's segments (about 53 appends of
# bulk each, or 5 s) end at a different point of the stream.
KILL_AFTER = (37, 81, 130)


def _chunk(n: int) -> bytes:
    return bytes((n * 7 + i) % 251 for i in range(CHUNK_BYTES))


async def _stream_until_killed(server: ServerProcess, appends: int) -> tuple[str, int]:
    """Stream ``appends`` chunks, then kill the server mid-stream; returns
    the session and how many appends the server answered a heartbeat after."""
    client = await WsClient.connect(server.ws_url)
    created = await client.expect("session.created")
    await client.send({"type": "session.update", "session": {"turn_detection": None}})
    await client.recv_until("session.updated")
    acknowledged = 0
    for n in range(appends):
        await client.append(_chunk(n), event_id=f"a{n}")
        if n % 10 == 9:
            await client.send({"type": "session.heartbeat"})
            await client.recv_until("session.heartbeat_ack")
            acknowledged = n + 1
        await asyncio.sleep(0.02)
    server.kill9()
    await client.close()
    return created["session"]["id"], acknowledged


def _bulk_fields(url: str, prefix: str, session_id: str) -> set[bytes]:
    return set(redis_client.Redis.from_url(url).hkeys(f"{prefix}:{{{session_id}}}:bulk"))


async def _logged_audio(url: str, prefix: str, media, session_id: str) -> dict[str, bytes]:
    log = RedisLog(url, prefix=prefix, media=BlobStore(media))
    try:
        records = await log.read(session_id)
    finally:
        await log.close()
    return {r.event_id: r.body.pcm for r in records if isinstance(r.body, AudioBody)}


async def test_a_killed_server_loses_no_audio_and_leaves_no_dangling_reference(
    redis_server, tmp_path
):
    media = tmp_path / "media"
    for appends in KILL_AFTER:
        prefix = f"k{uuid.uuid4().hex[:10]}"
        flags = {"redis_prefix": prefix, "media_dir": str(media), "lease_ttl_ms": 1000}
        server = ServerProcess(redis_server.url, **flags).start()
        session_id, acknowledged = await _stream_until_killed(server, appends)

        audio = await _logged_audio(redis_server.url, prefix, media, session_id)
        assert len(audio) >= acknowledged  # nothing the server had answered after is lost
        assert all(pcm == _chunk(int(eid[1:])) for eid, pcm in audio.items())  # byte for byte

        # The restarted server recovers the session and moves what the crash
        # left whole in Redis out to segments (a clean stop seals the rest).
        again = ServerProcess(redis_server.url, port=server.port, **flags).start()
        again.stop()
        fields = _bulk_fields(redis_server.url, prefix, session_id)
        assert fields and all(name[:1] in b"AOU" for name in fields), sorted(fields)[:4]
        assert await _logged_audio(redis_server.url, prefix, media, session_id) == audio


async def _sqlite_audio(path, session_id: str) -> dict[str, bytes]:
    log = SqliteLog(path, open_media=open_media)  # the media where the database says
    try:
        records = await log.read(session_id)
    finally:
        await log.close()
    return {r.event_id: r.body.pcm for r in records if isinstance(r.body, AudioBody)}


def _unsealed_rows(path, session_id: str) -> int:
    conn = sqlite3.connect(path)
    try:
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM records WHERE session_id = ? AND sealed = 0 "
            "AND (payload IS NOT NULL OR audio IS NOT NULL)",
            (session_id,),
        ).fetchone()
        return count
    finally:
        conn.close()


async def test_a_killed_server_on_sqlite_loses_no_audio_and_leaves_no_dangling_reference(
    tmp_path,
):
    media = tmp_path / "media"
    for appends in KILL_AFTER:
        path = tmp_path / f"killed-{appends}.db"
        server = ServerProcess(f"sqlite:{path}", media_dir=str(media)).start()
        session_id, acknowledged = await _stream_until_killed(server, appends)

        audio = await _sqlite_audio(path, session_id)
        assert len(audio) >= acknowledged  # nothing the server had answered after is lost
        assert all(pcm == _chunk(int(eid[1:])) for eid, pcm in audio.items())  # byte for byte

        # restarted without --media-dir: the database says where its media is
        again = ServerProcess(f"sqlite:{path}", port=server.port).start()
        again.stop()
        assert _unsealed_rows(path, session_id) == 0
        assert await _sqlite_audio(path, session_id) == audio
