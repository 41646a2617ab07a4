"""A stored video streams from its blob file: a 200 MB blob, whole and by
byte range, through the videos route's own response under uvicorn, with
the traced memory of the server and the client together far below the
file's size; its bytes are checked against their name once, and a blob
that no longer matches its name is refused, never served."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tracemalloc

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from batch_api.videos import _ranged
from duplex_server.jobs.blobs import BlobMissing, BlobStore
from duplex_server.sessions.core.records import BlobRef
from tests.conftest import free_port

SIZE = 200 << 20
BLOCK = 1 << 20


def stored_blob(store: BlobStore, size: int) -> BlobRef:
    """A ``size``-byte blob written into the store in blocks (never whole in
    memory), under its digest's name as the store names every blob."""
    digest, staging = hashlib.sha256(), store.root / "staging"
    with staging.open("wb") as out:
        for index in range(size // BLOCK):
            block = index.to_bytes(4, "little") * (BLOCK // 4)
            digest.update(block)
            out.write(block)
    ref = BlobRef(digest.hexdigest(), size, "video/mp4")
    store.path(ref.digest).parent.mkdir(exist_ok=True)
    os.replace(staging, store.path(ref.digest))
    return ref


@pytest.fixture
def store(tmp_path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


async def serve(store: BlobStore, ref: BlobRef):
    async def content(request: Request):
        path = await store.verified_path(ref)
        return _ranged(path, "video/mp4", request.headers.get("range"))

    app = Starlette(routes=[Route("/content", content)])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{port}/content"


async def test_a_200_mb_blob_streams_whole_and_by_range_in_flat_memory(store):
    ref = stored_blob(store, SIZE)
    server, task, url = await serve(store, ref)
    tracemalloc.start()
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            received, digest = 0, hashlib.sha256()
            async with http.stream("GET", url) as whole:
                assert whole.status_code == 200
                assert int(whole.headers["content-length"]) == SIZE
                async for chunk in whole.aiter_raw():
                    received += len(chunk)
                    digest.update(chunk)
            assert received == SIZE and digest.hexdigest() == ref.digest
            middle = await http.get(url, headers={"Range": "bytes=104857600-104857699"})
            tail = await http.get(url, headers={"Range": "bytes=-10"})
            beyond = await http.get(url, headers={"Range": f"bytes={SIZE}-"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        server.should_exit = True
        await task
    assert peak < 16 << 20, f"{peak / 2**20:.1f} MiB traced while streaming {SIZE >> 20} MiB"
    block = (100).to_bytes(4, "little") * 25  # the 101st block, from its first byte
    assert middle.status_code == 206 and middle.content == block
    assert middle.headers["content-range"] == f"bytes 104857600-104857699/{SIZE}"
    assert tail.status_code == 206 and len(tail.content) == 10
    assert tail.headers["content-range"] == f"bytes {SIZE - 10}-{SIZE - 1}/{SIZE}"
    assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{SIZE}"
    assert beyond.json()["error"]["code"] == "range_not_satisfiable"  # OpenAI's shape


def test_a_blob_is_checked_once_while_its_file_is_unchanged(store):
    ref = stored_blob(store, 4 * BLOCK)
    path = store.verified_path_sync(ref)
    assert path == store.path(ref.digest)
    stat = path.stat()
    # other bytes, the same size and time: the check is remembered, not redone
    with path.open("r+b") as blob:
        blob.seek(BLOCK)
        blob.write(b"\xff")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert store.verified_path_sync(ref) == path
    # a new time: checked again, and refused
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    with pytest.raises(BlobMissing, match="do not match their name"):
        store.verified_path_sync(ref)


def test_a_missing_or_shortened_blob_is_refused(store):
    ref = stored_blob(store, 2 * BLOCK)
    with store.path(ref.digest).open("r+b") as blob:
        blob.truncate(BLOCK)
    with pytest.raises(BlobMissing):
        store.verified_path_sync(ref)
    store.path(ref.digest).unlink()
    with pytest.raises(BlobMissing):
        store.verified_path_sync(ref)
