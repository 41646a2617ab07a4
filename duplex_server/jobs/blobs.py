"""A content-addressed blob store in a directory: large media stay out of the
log, which keeps their digest and size.

A blob is named by the SHA-256 of its bytes (``ab/abcdef...``), so the same
bytes are stored once and a name always means the same content. A write goes
to a temporary file in the store's ``tmp/`` folder, is flushed to disk and
renamed into place: a crash leaves a whole blob or none under its name, and
the leftovers in ``tmp/`` are removed when the store opens. The flush to
disk (``fsync``) is as durable as the log it serves: skipped where the log
itself does not reach the disk (the memory store, ``--durability
os-buffered``), where it would cost every job milliseconds for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from duplex_server.sessions.core.records import BlobRef


class BlobMissing(LookupError):
    """The log names a blob the store does not hold (deleted, or corrupt)."""


class BlobStore:
    def __init__(self, root: str | Path, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self._tmp = self.root / "tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)
        for leftover in self._tmp.iterdir():  # half-written by a process that died
            leftover.unlink(missing_ok=True)

    def path(self, digest: str) -> Path:
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self.root / digest[:2] / digest

    def put_sync(self, data: bytes, content_type: str) -> BlobRef:
        digest = hashlib.sha256(data).hexdigest()
        target = self.path(digest)
        ref = BlobRef(digest, len(data), content_type)
        if target.exists():
            os.utime(target)  # fresh again: the orphan sweep measures age by it
            return ref
        target.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._tmp)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                if self.fsync:
                    out.flush()
                    os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if self.fsync:
            _fsync_dir(target.parent)
        return ref

    def read_sync(self, ref: BlobRef) -> bytes:
        try:
            data = self.path(ref.digest).read_bytes()
        except FileNotFoundError:
            raise BlobMissing(ref.digest) from None
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.digest:
            raise BlobMissing(f"{ref.digest}: the stored bytes do not match their name")
        return data

    async def put(self, data: bytes, content_type: str) -> BlobRef:
        """Hashing and fsync are blocking work: off the event loop."""
        return await asyncio.to_thread(self.put_sync, data, content_type)

    async def read(self, ref: BlobRef) -> bytes:
        return await asyncio.to_thread(self.read_sync, ref)

    def digests(self) -> Iterator[tuple[str, float]]:
        """Every stored blob's digest and the time it was last written."""
        for folder in self.root.iterdir():
            if folder == self._tmp or not folder.is_dir():
                continue
            for blob in folder.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    yield blob.name, blob.stat().st_mtime

    def delete_sync(self, digests: set[str]) -> None:
        for digest in digests:
            self.path(digest).unlink(missing_ok=True)

    def sweep_sync(self, keep: set[str], min_age_s: float) -> list[str]:
        """Delete every blob not in ``keep`` that is older than ``min_age_s``
        (younger ones may belong to a job whose result is not logged yet)."""
        horizon = time.time() - min_age_s
        doomed = [d for d, written in self.digests() if d not in keep and written < horizon]
        for digest in doomed:
            self.path(digest).unlink(missing_ok=True)
        return doomed


def _fsync_dir(path: Path) -> None:
    """The rename is durable once the folder's entry is on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
