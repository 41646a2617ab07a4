"""``--media-retention-s`` (issue 41): with ``--media-dir``, a closed
session's media (its input audio, the answer's audio deltas) is deleted
that long after its last record, and its records stay, every one, with
their metadata; the purge does it once, paced like its deletes."""

from __future__ import annotations

import asyncio
import time
import uuid

from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from duplex_server.sessions.core.records import AudioBody, OutBody
from tests.conftest import running_server
from tests.wsclient import WsClient, tone_pcm16

HOUR_MS = 3_600_000


async def _talking(server) -> tuple[WsClient, str]:
    """A session (without turn detection) that sent 2 s of audio, uncommitted."""
    client = await WsClient.connect(server.ws_url)
    created = await client.expect("session.created")
    await client.send({"type": "session.update", "session": {"turn_detection": None}})
    await client.recv_until("session.updated")
    for n in range(20):
        await client.append(tone_pcm16(100), event_id=f"a{n}")
    return client, created["session"]["id"]


async def _talked_and_closed(server) -> str:
    """A session that sent audio, got an answer with audio, and closed."""
    client, session_id = await _talking(server)
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    await client.recv_until("response.done")
    await client.send({"type": "session.close"})
    await client.recv_until("session.closed")
    await client.close()
    await _left(server, session_id)
    return session_id


async def _left(server, session_id: str) -> None:
    for _ in range(200):  # the actor leaves once its close is logged
        if session_id not in server.manager.actors:
            return
        await asyncio.sleep(0.01)


def _config(redis_server, media, **flags) -> ServerConfig:
    """The echo on Redis with ``--media-dir`` ``media``, a prefix of its own."""
    prefix = f"m{uuid.uuid4().hex[:10]}"
    return ServerConfig(
        port=free_port(),
        store=redis_server.url,
        redis_prefix=prefix,
        media_dir=str(media),
        model="echo",
        **flags,
    )


async def test_a_closed_sessions_media_goes_and_its_records_stay(redis_server, tmp_path):
    media = tmp_path / "media"
    async with running_server(_config(redis_server, media, media_retention_s=3600)) as server:
        log = server.app.state.log
        session_id = await _talked_and_closed(server)
        await log.seal_media()
        before = await log.read(session_id)
        assert any(isinstance(r.body, AudioBody) and r.body.pcm for r in before)
        assert list(media.glob("??/*"))  # its media, sealed into segments

        now_ms = int(time.time() * 1000)
        assert await server.manager.purge(now_ms) == []  # within the media retention: kept
        assert list(media.glob("??/*"))
        expired = []
        original = log.expire_media

        async def counted(sid: str) -> None:
            expired.append(sid)
            await original(sid)

        log.expire_media = counted
        assert await server.manager.purge(now_ms + 2 * HOUR_MS) == []  # the session stays
        await server.manager.purge(now_ms + 3 * HOUR_MS)  # once only
        assert expired == [session_id]

        after = await log.read(session_id)
        assert [(r.seq, r.kind) for r in after] == [(r.seq, r.kind) for r in before]
        audio = [r.body for r in after if isinstance(r.body, AudioBody)]
        assert audio and all(not b.pcm and b.duration_ms == 100 for b in audio)
        outs = [r.body for r in after if isinstance(r.body, OutBody)]
        assert outs and all(b.trimmed and not b.payload for b in outs)
        assert not list(media.glob("??/*"))  # the segments are deleted
        (row,) = [row for row in await log.sessions() if row.session_id == session_id]
        assert row.media_expired and row.closed
        server.final_states.pop(session_id, None)  # its refold lacks the audio: by design


async def test_keeping_no_audio_deletes_a_sessions_segments_at_its_close(redis_server, tmp_path):
    """``--retain-audio none`` with ``--media-dir``: what was sealed during
    the call goes with its close, not a retention later; the records stay."""
    media = tmp_path / "media"
    async with running_server(_config(redis_server, media, retain_audio="none")) as server:
        log = server.app.state.log
        client, session_id = await _talking(server)
        await log.seal_media()
        assert list(media.glob("??/*"))  # the call's audio, sealed into a segment
        await client.send({"type": "input_audio_buffer.commit"})
        await client.send({"type": "response.create"})
        await client.recv_until("response.done")
        await client.send({"type": "session.close"})
        await client.recv_until("session.closed")
        await client.close()
        await _left(server, session_id)
        await log.seal_media()
        assert not list(media.glob("??/*"))  # every segment of it deleted
        after = await log.read(session_id)
        audio = [r.body for r in after if isinstance(r.body, AudioBody)]
        assert len(audio) == 20 and all(not b.pcm and b.duration_ms == 100 for b in audio)
        (row,) = [row for row in await log.sessions() if row.session_id == session_id]
        assert row.media_expired and row.closed
        server.final_states.pop(session_id, None)  # its refold lacks the audio: by design
