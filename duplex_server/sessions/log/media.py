"""Audio out of the hot log: a session's bulk bytes sealed into segments.

A record's bulk (its input audio, a native model's unit samples, an
outbound event's wire payload) is written to the store with the record, as
it always was: an append is acknowledged once the store holds both, and
nothing on that path changes. Then, a few seconds of a session's bulk at a
time, the :class:`MediaSealer` writes it out as one segment to a blob store
(content-addressed, flushed to disk or acknowledged by the object store),
and only then asks the store to swap each bulk value for a reference to its
place in the segment (digest, size, offset, length: tens of bytes instead
of kilobytes). Reads put the bytes back (:class:`SegmentReader`), so the
fold, resume, replay and audit see the records they always saw.

The order is what makes a crash harmless. Killed before the segment is
durable: the bulk is still in the store, the half-written segment is
swept as a temporary file. Killed between the segment and the swap (or
the store down then): the bulk is still in the store, and the session is
sealed again after its next read; the segment is an orphan, listed
nowhere, which :func:`sweep_orphans` deletes once it is older than
``ORPHAN_GRACE_S`` (its header names the session; the session does not
list it), so no audio outlives the retention chosen for it. Killed after
the swap: the references name a durable segment. At no point does a
reference name bytes that are not stored, and acknowledged audio is never
only in memory.

A segment that is missing or does not match its digest is reported, never
replaced: :class:`MediaUnavailable` is the store's ``StorageUnavailable``
(the session answers ``storage_unavailable``) and names the segment.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Protocol, runtime_checkable

import msgspec

from duplex_server import metrics
from duplex_server.sessions.core.records import BlobRef
from duplex_server.sessions.log.store import StorageUnavailable

SEGMENT_TYPE = "application/x-duplex-media-segment"
SEGMENT_HEADER = b"duplex-media-segment 1 "  # then the session id and a newline
SEAL_BYTES = 256 << 10  # a session's bulk is sealed once this much waits...
SEAL_AFTER_S = 5.0  # ...or once the oldest of it has waited this long
CACHED_BYTES = 32 << 20  # segments kept read, for the reads that follow
# A blob younger than this is never an orphan: its seal may not have listed
# it yet, another replica may be writing it, an object store's clock may differ.
ORPHAN_GRACE_S = 3600.0
SWEEP_EXAMINED = 512  # blobs one sweep looks at; the rest wait for the next
HEADER_BYTES = 512  # what is read of a blob to learn whose it is


class SegmentBlobs(Protocol):
    """Where segments go: the filesystem :class:`~duplex_server.jobs.blobs.BlobStore`
    (fsync before it returns) or an object store (an acknowledged PUT)."""

    def put_sync(self, data: bytes, content_type: str) -> BlobRef: ...

    def read_sync(self, ref: BlobRef) -> bytes: ...

    def delete_sync(self, digests: set[str]) -> None: ...

    def digests(self, after: str = "") -> Iterator[tuple[str, float]]:
        """Every blob's digest and last write time (seconds since the
        epoch), in digest order from past ``after``."""
        ...

    def header_sync(self, digest: str, length: int) -> bytes:
        """A blob's first ``length`` bytes, unchecked (``LookupError``: gone)."""
        ...

    def delete_older_sync(self, digests: set[str], written_before: float) -> list[str]:
        """Delete those of ``digests`` not written again since ``written_before``."""
        ...


class MediaUnavailable(StorageUnavailable):
    """A sealed record's segment is missing or corrupt: reported, not replaced."""


class MediaRef(msgspec.Struct, array_like=True):
    """Where one bulk value lives: ``length`` bytes at ``offset`` of a segment
    (named by its SHA-256, kept raw: a reference is about 45 bytes)."""

    digest: bytes
    size: int
    offset: int
    length: int


_ref_encoder = msgspec.msgpack.Encoder()
_ref_decoder = msgspec.msgpack.Decoder(MediaRef)


def encode_ref(ref: MediaRef) -> bytes:
    return _ref_encoder.encode(ref)


def decode_ref(encoded: bytes) -> MediaRef:
    return _ref_decoder.decode(encoded)


class SegmentReader:
    """Bulk values back from their segments: each segment read (and checked
    against its digest) once, then kept while it is among the most recently
    used ``CACHED_BYTES``. Blocking reads: call it off the event loop."""

    def __init__(self, blobs: SegmentBlobs, cached_bytes: int = CACHED_BYTES) -> None:
        self._blobs = blobs
        self._cached_bytes = cached_bytes
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._held = 0

    def resolve(self, session_id: str, what: str, encoded: bytes) -> bytes:
        """The bytes a reference names (``what``: the record it belongs to, for the report)."""
        try:
            ref = _ref_decoder.decode(encoded)
        except msgspec.DecodeError as exc:
            raise MediaUnavailable(f"{session_id} {what}: unreadable media reference") from exc
        segment = self._segment(session_id, what, ref)
        if ref.offset + ref.length > len(segment):
            raise MediaUnavailable(
                f"{session_id} {what}: segment {ref.digest.hex()} holds {len(segment)} bytes, "
                f"the reference reaches {ref.offset + ref.length}"
            )
        return segment[ref.offset : ref.offset + ref.length]

    def whole(self, session_id: str, what: str, digest: bytes, size: int) -> bytes:
        """A segment's bytes entire (an archive of old records), checked and cached."""
        return self._segment(session_id, what, MediaRef(digest, size, 0, size))

    def _segment(self, session_id: str, what: str, ref: MediaRef) -> bytes:
        digest = ref.digest.hex()
        cached = self._cache.get(digest)
        if cached is not None:
            self._cache.move_to_end(digest)
            return cached
        try:
            data = self._blobs.read_sync(BlobRef(digest, ref.size, SEGMENT_TYPE))
        except LookupError as exc:  # BlobMissing: deleted, or its bytes do not match
            raise MediaUnavailable(f"{session_id} {what}: media segment {exc}") from exc
        except OSError as exc:
            message = f"{session_id} {what}: media segment {digest}: {exc}"
            raise MediaUnavailable(message) from exc
        self._cache[digest] = data
        self._held += len(data)
        while self._held > self._cached_bytes and len(self._cache) > 1:
            _, dropped = self._cache.popitem(last=False)
            self._held -= len(dropped)
        return data


@dataclass
class _Waiting:
    """One session's bulk not sealed yet, in append order."""

    values: dict[str, bytes] = field(default_factory=dict)  # store field -> bytes
    size: int = 0
    since: float = 0.0
    sealing: asyncio.Task[None] | None = None


class BulkSwap(Protocol):
    """What the store does once a segment is durable: swap each named bulk
    value (still present) for its reference, atomically; then move the
    records long behind the latest snapshot out as well."""

    async def swap_bulk(self, session_id: str, refs: dict[str, bytes]) -> int: ...

    async def archive_old(self, session_id: str) -> None: ...


logger = logging.getLogger(__name__)


class MediaSealer:
    """Collects each session's bulk as it is appended and seals it into
    segments in the background, one seal at a time per session."""

    def __init__(
        self,
        blobs: SegmentBlobs,
        store: BulkSwap,
        *,
        seal_bytes: int = SEAL_BYTES,
        seal_after_s: float = SEAL_AFTER_S,
    ) -> None:
        self._blobs = blobs
        self._store = store
        self.seal_bytes = seal_bytes
        self.seal_after_s = seal_after_s
        self._waiting: dict[str, _Waiting] = {}
        self.sealed_segments = 0  # for the tests and the bench

    def appended(self, session_id: str, values: dict[str, bytes]) -> None:
        """The store acknowledged these bulk values: seal them when enough wait."""
        if not values:
            return
        waiting = self._waiting.setdefault(session_id, _Waiting())
        if not waiting.values:
            waiting.since = time.monotonic()
        for name, data in values.items():
            waiting.size += len(data) - len(waiting.values.get(name, b""))
            waiting.values[name] = data
        due = waiting.size >= self.seal_bytes or (
            time.monotonic() - waiting.since >= self.seal_after_s
        )
        if due:
            self._start(session_id, waiting)

    def adopt(self, session_id: str, values: dict[str, bytes]) -> None:
        """Bulk a read found unsealed (a crash came before its seal): sealed
        like new appends, unless this process is already sealing the session."""
        if session_id not in self._waiting:
            self.appended(session_id, values)

    def forget(self, session_id: str) -> None:
        """The session was deleted: nothing of it is sealed any more."""
        waiting = self._waiting.pop(session_id, None)
        if waiting is not None and waiting.sealing is not None:
            waiting.sealing.cancel()

    async def drain(self) -> None:
        """Seal everything that waits now, whatever its size (shutdown, tests)."""
        for session_id, waiting in list(self._waiting.items()):
            self._start(session_id, waiting)
        tasks = [w.sealing for w in self._waiting.values() if w.sealing is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, session_id: str, waiting: _Waiting) -> None:
        if waiting.sealing is None and waiting.values:
            waiting.sealing = asyncio.get_running_loop().create_task(
                self._seal(session_id, waiting)
            )

    async def _seal(self, session_id: str, waiting: _Waiting) -> None:
        try:
            while waiting.values:
                values, waiting.values, waiting.size = waiting.values, {}, 0
                segment, places = _segment_of(session_id, values)
                try:
                    blob = await asyncio.to_thread(self._blobs.put_sync, segment, SEGMENT_TYPE)
                    refs = {
                        name: encode_ref(
                            MediaRef(bytes.fromhex(blob.digest), blob.size, start, length)
                        )
                        for name, (start, length) in places.items()
                    }
                    await self._store.swap_bulk(session_id, refs)
                    await self._store.archive_old(session_id)
                except (OSError, StorageUnavailable) as exc:
                    # The bulk stays in the store, where it is safe; it is
                    # sealed after the session's next read. Said, because
                    # the store's memory grows while the media cannot go.
                    metrics.STORE_ERRORS.labels("seal_media").inc()
                    logger.warning(
                        "could not seal %d media values of session %s out of the store "
                        "(they stay there, sealed after its next read): %s",
                        len(values),
                        session_id,
                        exc,
                    )
                    return
                self.sealed_segments += 1
        finally:
            waiting.sealing = None
            if not waiting.values and self._waiting.get(session_id) is waiting:
                del self._waiting[session_id]


def _segment_of(
    session_id: str, values: dict[str, bytes]
) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The values end to end behind a header naming the session, and where
    each one starts and how long it is. The header makes every session's
    segments its own: two sessions that sent the same bytes (silence, say)
    would otherwise share a content-addressed segment, and deleting one
    session's media would take the other's."""
    header = SEGMENT_HEADER + session_id.encode() + b"\n"
    refs: dict[str, tuple[int, int]] = {}
    at = len(header)
    for name, data in values.items():
        refs[name] = (at, len(data))
        at += len(data)
    return header + b"".join(values.values()), refs


# --- orphans: segments a crash or an outage left unlisted ----------------------


def segment_owner(header: bytes) -> str | None:
    """The session a segment's first bytes name (see :func:`_segment_of`);
    None for anything else, or a header cut short: what the sweep cannot
    attribute, it keeps."""
    if not header.startswith(SEGMENT_HEADER):
        return None
    name, newline, _ = header[len(SEGMENT_HEADER) :].partition(b"\n")
    if not newline or not name:
        return None
    try:
        return name.decode()
    except UnicodeDecodeError:
        return None


@runtime_checkable
class MediaSweeping(Protocol):
    """A store that keeps media apart can delete its orphans (the session
    manager's housekeeping calls this every purge interval)."""

    async def sweep_media(self, now_s: float) -> int: ...


@dataclass(frozen=True)
class SweepPass:
    """What one sweep did: the orphans it deleted, and where the next one
    starts looking ("": from the first blob again)."""

    deleted: list[str]
    resume_after: str


async def sweep_orphans(
    blobs: SegmentBlobs,
    listed: Callable[[str], Awaitable[set[str]]],
    now_s: float,
    *,
    owner_of: Callable[[bytes], str | None] = segment_owner,
    after: str = "",
    grace_s: float = ORPHAN_GRACE_S,
    examined: int = SWEEP_EXAMINED,
) -> SweepPass:
    """Delete the blobs no session lists, among ``examined`` of them from
    past ``after``. A blob is an orphan only when all three hold: it was
    last written more than ``grace_s`` before ``now_s``; its header names a
    session (``owner_of``: a job's blob, or anything else, is kept); and
    that session's listing (``listed``, asked once per session) lacks it.
    A deleted session lists nothing, so what a crash left of it goes too.
    Blocking work (the listing, the headers, the deletes) runs off the
    event loop, and a pass looks at a bounded number of blobs, so a large
    media folder never holds up live appends: the rest wait for the next."""
    seen = await asyncio.to_thread(_first_blobs, blobs, after, examined)
    horizon = now_s - grace_s
    old = [digest for digest, written in seen if written < horizon]
    owned = await asyncio.to_thread(_owners, blobs, old, owner_of)
    doomed: set[str] = set()
    for session_id, digests in owned.items():
        doomed |= digests - await listed(session_id)
    deleted = await asyncio.to_thread(blobs.delete_older_sync, doomed, horizon) if doomed else []
    return SweepPass(deleted, seen[-1][0] if len(seen) == examined else "")


class OrphanSweep:
    """A store's sweep of its media, pass after pass, each going on where
    the last one stopped."""

    def __init__(
        self,
        blobs: SegmentBlobs,
        listed: Callable[[str], Awaitable[set[str]]],
        owner_of: Callable[[bytes], str | None] = segment_owner,
    ) -> None:
        self._blobs = blobs
        self._listed = listed
        self._owner_of = owner_of
        self._after = ""

    async def run(self, now_s: float) -> int:
        """One pass; a failing folder or object store is the store's
        ``StorageUnavailable`` (housekeeping says so and tries again)."""
        try:
            swept = await sweep_orphans(
                self._blobs, self._listed, now_s, owner_of=self._owner_of, after=self._after
            )
        except OSError as exc:
            raise StorageUnavailable(f"media sweep: {exc}") from exc
        self._after = swept.resume_after
        if swept.deleted:
            logger.info("deleted %d orphan media segments no session lists", len(swept.deleted))
        return len(swept.deleted)


def _first_blobs(blobs: SegmentBlobs, after: str, examined: int) -> list[tuple[str, float]]:
    return list(islice(blobs.digests(after), examined))


def _owners(
    blobs: SegmentBlobs, digests: list[str], owner_of: Callable[[bytes], str | None]
) -> dict[str, set[str]]:
    """The blobs by the session their headers name; those gone meanwhile,
    or naming none, left out."""
    owned: dict[str, set[str]] = {}
    for digest in digests:
        try:
            header = blobs.header_sync(digest, HEADER_BYTES)
        except LookupError:  # deleted since it was listed
            continue
        session_id = owner_of(header)
        if session_id is not None:
            owned.setdefault(session_id, set()).add(digest)
    return owned
