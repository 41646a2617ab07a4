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
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from duplex_server.sessions.core.records import BlobRef

CHUNK_BYTES = 256 << 10  # what one read of a streamed blob holds in memory
VERIFIED_KEPT = 4096  # blobs whose check is remembered (then checked again)


class BlobMissing(LookupError):
    """The log names a blob the store does not hold (deleted, or corrupt)."""


def is_digest(name: str) -> bool:
    """A lower-case hex SHA-256, as every blob is named."""
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def checked_digest(digest: str) -> str:
    """``digest`` if it is a lower-case hex SHA-256: it becomes a file or
    object name, so nothing else (a path, a slash) may pass."""
    if not is_digest(digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return digest


class BlobStore:
    def __init__(self, root: str | Path, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self._tmp = self.root / "tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)
        # (digest, size, mtime_ns) of the files found to match their names
        self._verified: OrderedDict[tuple[str, int, int], None] = OrderedDict()
        for leftover in self._tmp.iterdir():  # half-written by a process that died
            leftover.unlink(missing_ok=True)

    def path(self, digest: str) -> Path:
        return self.root / digest[:2] / checked_digest(digest)

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

    def verified_path_sync(self, ref: BlobRef) -> Path:
        """The blob's file, once its bytes were found to match their name
        (read in chunks: memory does not grow with the file). The check is
        remembered while the file's size and time stay those it had, so a
        byte range of a large blob costs its own bytes, not the whole file's."""
        path = self.path(ref.digest)
        try:
            stat = path.stat()
        except FileNotFoundError:
            raise BlobMissing(ref.digest) from None
        key = (ref.digest, stat.st_size, stat.st_mtime_ns)
        if key in self._verified:
            self._verified.move_to_end(key)
            return path
        digest = hashlib.sha256()
        with path.open("rb") as blob:
            while chunk := blob.read(CHUNK_BYTES):
                digest.update(chunk)
        if stat.st_size != ref.size or digest.hexdigest() != ref.digest:
            raise BlobMissing(f"{ref.digest}: the stored bytes do not match their name")
        self._verified[key] = None
        if len(self._verified) > VERIFIED_KEPT:
            self._verified.popitem(last=False)
        return path

    async def verified_path(self, ref: BlobRef) -> Path:
        return await asyncio.to_thread(self.verified_path_sync, ref)

    async def put(self, data: bytes, content_type: str) -> BlobRef:
        """Hashing and fsync are blocking work: off the event loop."""
        return await asyncio.to_thread(self.put_sync, data, content_type)

    async def read(self, ref: BlobRef) -> bytes:
        return await asyncio.to_thread(self.read_sync, ref)

    def digests(self, after: str = "") -> Iterator[tuple[str, float]]:
        """Every stored blob's digest and the time it was last written, in
        digest order from past ``after``: a sweep that stops early goes on
        from where it stopped next time (one folder sorted at a time, about
        1/256 of the blobs, so memory does not grow with the store). A file
        not named as a blob is no blob (and never offered for deletion)."""
        folders = sorted(
            f for f in self.root.iterdir() if f != self._tmp and f.is_dir() and f.name >= after[:2]
        )
        for folder in folders:
            for name in sorted(blob.name for blob in folder.iterdir()):
                if name <= after or not is_digest(name) or name[:2] != folder.name:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    yield name, (folder / name).stat().st_mtime

    def header_sync(self, digest: str, length: int) -> bytes:
        """A blob's first ``length`` bytes (what it is, and whose), unchecked:
        the orphan sweep reads only enough to attribute it."""
        try:
            with self.path(digest).open("rb") as blob:
                return blob.read(length)
        except FileNotFoundError:
            raise BlobMissing(digest) from None

    def delete_older_sync(self, digests: set[str], written_before: float) -> list[str]:
        """Delete the named blobs still last written before ``written_before``.
        Each is first moved aside, then its time checked: a put of the same
        bytes since (a session sealed again after a crash) either refreshed
        it before the move, and it is put back, or found it gone and wrote a
        new one; never a reference to a file deleted under it. A crash
        between leaves it in ``tmp/``, emptied when the store opens."""
        deleted = []
        for digest in sorted(digests):
            target = self.path(digest)
            aside = self._tmp / f"sweep-{digest}"
            try:
                os.replace(target, aside)
            except FileNotFoundError:
                continue
            if aside.stat().st_mtime < written_before:
                aside.unlink()
                deleted.append(digest)
            else:
                os.replace(aside, target)  # the same name, so the same bytes
        return deleted

    def delete_sync(self, digests: set[str]) -> None:
        for digest in digests:
            self.path(digest).unlink(missing_ok=True)

    def sweep_sync(self, keep: set[str], min_age_s: float) -> list[str]:
        """Delete every blob not in ``keep`` that is older than ``min_age_s``
        (younger ones may belong to a job whose result is not logged yet)."""
        horizon = time.time() - min_age_s
        doomed = {d for d, written in self.digests() if d not in keep and written < horizon}
        return self.delete_older_sync(doomed, horizon)


async def stream_file(path: Path, first: int, length: int) -> AsyncIterator[bytes]:
    """``length`` bytes of ``path`` from ``first``, a chunk at a time, each
    read off the event loop. The file is opened before the first chunk, so a
    blob deleted while it streams still streams whole (its data stays until
    the file is closed)."""
    blob = await asyncio.to_thread(path.open, "rb")
    try:
        await asyncio.to_thread(blob.seek, first)
        left = length
        while left > 0:
            chunk = await asyncio.to_thread(blob.read, min(CHUNK_BYTES, left))
            if not chunk:  # shortened under us: the response ends short, visibly
                raise BlobMissing(f"{path.name}: the file ended {left} bytes early")
            left -= len(chunk)
            yield chunk
    finally:
        blob.close()


def _fsync_dir(path: Path) -> None:
    """The rename is durable once the folder's entry is on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
