"""Redis log backend: the multi-replica store.

Layout, per session, every key tagged ``{session_id}`` (one Cluster slot):

- ``<p>:{sid}:log``   stream; entry ``<seq>-0`` holds the record (``r``,
  msgpack without bulk bytes) and the fence that wrote it (``f``);
- ``<p>:{sid}:bulk``  hash of the bytes retention may drop: ``o<n>`` the
  payload of server event n, ``a<seq>`` the samples of an audio record,
  ``u<seq>`` those of a native model's unit; with ``--media-dir``, once a
  segment holds them, ``O<n>`` / ``A<seq>`` / ``U<seq>`` hold a reference
  to their place in it instead (``sessions/log/media.py``);
- ``<p>:{sid}:meta``  hash: fence, owner, last_seq, last_ts_ms, closed,
  trimmed_upto, compacted_upto;
- ``<p>:{sid}:eids``  sorted set of recent client event ids (idempotency);
- ``<p>:{sid}:lease`` the owner's replica id, with the lease TTL;
- ``<p>:{sid}:want``  a replica that asked the owner to hand the session over.

Plus ``<p>:sessions``, a sorted set of every session id (by creation time).

Appends from all sessions are sent together: whatever was queued while the
previous pipeline was in flight goes out as the next one (one round trip for
many sessions, as the SQLite writer shares one fsync). A call that cannot
reach Redis is retried for ``retry_window_ms`` and then fails with
``StorageUnavailable``; nothing is buffered beyond that window. Retrying an
append is safe: the script recognises a batch that already landed.

Durability is Redis's own: with ``appendfsync everysec`` an acknowledged
append can be lost if the Redis host crashes within that second.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from duplex_server.sessions.core.records import OutBody, Record
from duplex_server.sessions.log import redis_archive, redis_scripts
from duplex_server.sessions.log.media import (
    MediaSealer,
    MediaUnavailable,
    OrphanSweep,
    SegmentBlobs,
    SegmentReader,
    decode_ref,
    segment_owner,
)
from duplex_server.sessions.log.record_codec import decode_records, encode_records, record_decoder
from duplex_server.sessions.log.redis_pipe import RedisPipe
from duplex_server.sessions.log.redis_scripts import (
    ACQUIRE,
    APPEND,
    ARCHIVE,
    DROP_BULK,
    RELEASE,
    RENEW,
    SWAP_BULK,
)
from duplex_server.sessions.log.store import (
    EVENT_ID_WINDOW,
    DuplicateEvent,
    LeaseHeld,
    LeaseStatus,
    SequenceConflict,
    SessionRow,
    StaleFence,
    StorageUnavailable,
    UnknownSession,
)

T = TypeVar("T")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://")
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
_RENEWAL = {1: "held", 0: "lost", 2: "handoff"}
# Pipelines in flight at once, each on its own connection: one at a time
# left Redis idle for a round trip per pipeline. A session has at most one
# append outstanding (its actor awaits it), so pipelines never reorder a session.
FLUSHERS = 4
_RETRY_ARG = 6  # index of the retry flag in the append script's ARGV


class _PackedConnection(aioredis.Connection):
    """Commands packed by hiredis in C: redis-py's Python packer took 40% of
    the CPU of a saturated append path (``bench sessions --store redis``)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str) and " " in args[0]:
            args = (*args[0].split(), *args[1:])  # "SCRIPT LOAD" is two words on the wire
        return [hiredis.pack_command(args)]


def connect(url: str, **options: Any) -> aioredis.Redis:
    """A client for ``redis://``, ``rediss://``, ``unix://`` or
    ``redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` (the master
    that the sentinels name, followed across failovers)."""
    if url.startswith("redis://"):
        return aioredis.from_url(url, connection_class=_PackedConnection, **options)
    if not url.startswith("redis+sentinel://"):
        return aioredis.from_url(url, **options)
    hosts, _, path = url.removeprefix("redis+sentinel://").partition("/")
    service, _, db = path.partition("/")
    if not hosts or not service:
        raise ValueError(f"{url!r}: expected redis+sentinel://HOST:PORT[,HOST:PORT]/SERVICE[/DB]")
    nodes = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "26379")
        nodes.append((name, int(port)))
    sentinel = Sentinel(nodes, socket_timeout=options.get("socket_timeout"))
    return sentinel.master_for(service, db=int(db or 0), **options)


class _Keys:
    __slots__ = ("meta", "log", "bulk", "eids", "lease", "want", "archive", "segments")

    def __init__(self, prefix: str, session_id: str) -> None:
        base = f"{prefix}:{{{session_id}}}"
        self.meta = f"{base}:meta"
        self.log = f"{base}:log"
        self.bulk = f"{base}:bulk"
        self.eids = f"{base}:eids"
        self.lease = f"{base}:lease"
        self.want = f"{base}:want"
        self.archive = f"{base}:archive"
        # every media segment sealed for the session, whether or not a
        # reference still names it (a trim or a compaction drops references)
        self.segments = f"{base}:segments"


def _refusal(session_id: str, exc: ResponseError) -> Exception:
    """Map a script's error reply to the log interface's exception."""
    word, _, rest = str(exc).removeprefix("ERR ").partition(" ")
    if word == "UNKNOWN":
        return UnknownSession(session_id)
    if word == "STALE":
        return StaleFence(f"{session_id}: the lease moved on to fence {rest}")
    if word == "SEQ":
        return SequenceConflict(f"{session_id}: batch does not follow seq {rest}")
    if word == "DUP":
        seq, _, event_id = rest.partition(" ")
        return DuplicateEvent(event_id, int(seq))
    return StorageUnavailable(f"redis refused the write: {exc}")


def _append_args(
    records: list[Record], fence: int, window: int, bulk: dict[str, bytes]
) -> list[Any]:
    """The APPEND script's arguments; ``bulk`` gets each bulk field's value."""
    args: list[Any] = [
        fence,
        records[0].seq,
        len(records),
        records[-1].ts_ms,
        int(any(r.kind == "close" for r in records)),
        window,
        0,  # retry flag, set when the batch is sent again
        max((r.seq for r in records if r.kind == "snapshot"), default=0),
    ]
    for row in encode_records(records, split_audio=True):
        payload_field = f"o{row.server_event_seq}" if row.payload is not None else ""
        # a native model's units apart from input audio: retention compacts
        # a turn's input (a<seq>), never the units a resume prefills from
        audio_field = (
            f"{'u' if row.kind == 'unit' else 'a'}{row.seq}" if row.audio is not None else ""
        )
        args += [
            row.event_id or "",
            row.blob,
            payload_field,
            row.payload or b"",
            audio_field,
            row.audio or b"",
        ]
        if row.payload:
            bulk[payload_field] = row.payload
        if row.audio:
            bulk[audio_field] = row.audio
    return args


class _Append:
    __slots__ = ("session_id", "keys", "args", "future")

    def __init__(self, session_id: str, keys: _Keys, args: list[Any], future) -> None:
        self.session_id = session_id
        self.keys = keys
        self.args = args
        self.future = future


class RedisLog:
    durable = True
    shared = True

    def __init__(
        self,
        url: str,
        *,
        lease_ttl_ms: int = 5000,
        retry_window_ms: int = 1000,
        prefix: str = "dx",
        event_id_window: int = EVENT_ID_WINDOW,
        media: SegmentBlobs | None = None,
    ) -> None:
        self.url = url
        # --media-dir: a session's bulk moves out to segments a few seconds
        # at a time, and the bulk hash keeps references (sessions/log/media.py)
        self._media = media
        self._sealer = MediaSealer(media, self) if media is not None else None
        self._segments = SegmentReader(media) if media is not None else None
        self._sweep = (
            OrphanSweep(media, self.media_listed, _media_owner) if media is not None else None
        )
        self.lease_ttl_ms = lease_ttl_ms
        self.retry_window_s = retry_window_ms / 1000
        self.prefix = prefix
        self._window = event_id_window
        self._redis = connect(
            url,
            socket_timeout=max(0.5, self.retry_window_s),
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),  # retries are ours: bounded by the window
        )
        # Loaded once, then called by hash inside pipelines: no SCRIPT EXISTS
        # round trip per call. A restarted Redis forgets them (NOSCRIPT): reloaded.
        self._scripts_loaded = False
        self._pending: list[_Append] = []
        self._flushers: set[asyncio.Task[None]] = set()
        # One bare connection per flusher on plain redis:// (see redis_pipe).
        self._pipes: list[RedisPipe] | None = (
            [RedisPipe(url, max(0.5, self.retry_window_s)) for _ in range(FLUSHERS)]
            if url.startswith("redis://")
            else None
        )

    def _keys(self, session_id: str) -> _Keys:
        return _Keys(self.prefix, session_id)

    async def _call(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation``, retrying while Redis is unreachable, up to the window."""
        deadline = time.monotonic() + self.retry_window_s
        delay = 0.02
        while True:
            try:
                if not self._scripts_loaded:
                    for script in redis_scripts.ALL:
                        await self._redis.script_load(script.text)
                    self._scripts_loaded = True
                return await operation()
            except NoScriptError:
                self._scripts_loaded = False  # Redis restarted: reload, then retry at once
                if time.monotonic() > deadline:
                    raise StorageUnavailable(f"redis at {self.url} lost its scripts") from None
                continue
            except _UNREACHABLE as exc:
                if time.monotonic() + delay > deadline:
                    raise StorageUnavailable(f"redis at {self.url} is unreachable: {exc}") from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)

    # --- sessions ----------------------------------------------------------

    async def create(self, session_id: str) -> None:
        keys = self._keys(session_id)

        async def create() -> None:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hsetnx(keys.meta, "fence", 0)
                pipe.hsetnx(keys.meta, "last_seq", 0)
                pipe.zadd(f"{self.prefix}:sessions", {session_id: time.time() * 1000}, nx=True)
                await pipe.execute()

        await self._call(create)

    async def delete(self, session_id: str) -> None:
        keys = self._keys(session_id)
        if self._media is not None:
            await self._delete_media(session_id)

        async def delete() -> None:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(
                    *(keys.meta, keys.log, keys.bulk, keys.eids, keys.lease, keys.want),
                    *(keys.archive, keys.segments),
                )
                pipe.zrem(f"{self.prefix}:sessions", session_id)
                await pipe.execute()

        await self._call(delete)
        if self._sealer is not None:
            self._sealer.forget(session_id)

    async def expire_media(self, session_id: str) -> None:
        """``--media-retention-s``: the session's media goes, its records stay.
        Marked first, then its bulk dropped and its media segments deleted
        (not its archives: they hold the records); a crash between leaves
        files behind, never a reference a read would follow."""
        if self._media is None:
            return
        keys = self._keys(session_id)
        media, segments = self._media, self._segments
        assert segments is not None
        if self._sealer is not None:
            # what waits to be sealed goes with the bulk (a seal already
            # under way lists its segment, for the session's delete)
            self._sealer.forget(session_id)

        async def fetch_and_drop() -> list[Any]:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(keys.bulk)
                pipe.lrange(keys.archive, 0, -1)
                pipe.smembers(keys.segments)
                pipe.hset(keys.meta, "media_expired", 1)
                pipe.delete(keys.bulk, keys.segments)
                return await pipe.execute()

        bulk, listed, sealed, *_ = await self._call(fetch_and_drop)

        doomed = _named_media(session_id, segments, bulk, listed, sealed, with_archives=False)
        await asyncio.to_thread(lambda: media.delete_sync(doomed()))

    async def _delete_media(self, session_id: str) -> None:
        """The segments the session's references name, and its archives,
        deleted before its keys (a crash between leaves references to
        nothing in a session being deleted anyway, never the other way)."""
        media = self._media
        assert media is not None
        doomed = await self.media_listed(session_id)
        await asyncio.to_thread(media.delete_sync, doomed)

    async def media_listed(self, session_id: str) -> set[str]:
        """Every segment and archive the session's keys name: those sealed
        for it, those its references name (in its bulk and in its archives)
        and the archives. What a delete deletes, and what the orphan sweep
        keeps; a session that is gone names nothing."""
        keys = self._keys(session_id)
        segments = self._segments
        assert segments is not None

        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(keys.bulk)
                pipe.lrange(keys.archive, 0, -1)
                pipe.smembers(keys.segments)
                return await pipe.execute()

        bulk, listed, sealed = await self._call(fetch)
        named = _named_media(session_id, segments, bulk, listed, sealed, with_archives=True)
        return await asyncio.to_thread(named)

    async def sweep_media(self, now_s: float) -> int:
        """Delete media segments and archives that no session lists (a crash
        or an outage between a segment's write and its listing), some at a
        time (``media.sweep_orphans``); nothing without a media folder."""
        return 0 if self._sweep is None else await self._sweep.run(now_s)

    async def sessions(self, *, open_only: bool = False) -> list[SessionRow]:
        async def fetch() -> list[SessionRow]:
            members = await self._redis.zrange(f"{self.prefix}:sessions", 0, -1)
            ids = [sid.decode() if isinstance(sid, bytes) else str(sid) for sid in members]
            async with self._redis.pipeline(transaction=False) as pipe:
                for session_id in ids:
                    pipe.hgetall(self._keys(session_id).meta)
                metas = await pipe.execute()
            return [
                _row(session_id, meta)
                for session_id, meta in zip(ids, metas, strict=True)
                if meta and not (open_only and meta.get(b"closed") == b"1")
            ]

        return await self._call(fetch)

    # --- leases ------------------------------------------------------------

    async def acquire_lease(
        self,
        session_id: str,
        owner: str,
        *,
        expect_fence: int | None = None,
        handoff: bool = False,
    ) -> int:
        keys = self._keys(session_id)
        args = [owner, self.lease_ttl_ms, "" if expect_fence is None else expect_fence]
        args.append(int(handoff))
        try:
            reply = await self._call(
                lambda: _eval(self._redis, ACQUIRE, [keys.meta, keys.lease, keys.want], args)
            )
        except ResponseError as exc:
            raise _refusal(session_id, exc) from None
        if reply[0] == 0:
            raise LeaseHeld(session_id, reply[1].decode(), int(reply[2]))
        return int(reply[1])

    async def renew_leases(self, owner: str, leases: dict[str, int]) -> dict[str, LeaseStatus]:
        if not leases:
            return {}

        async def renew() -> list[int]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for session_id, fence in leases.items():
                    keys = self._keys(session_id)
                    _eval(
                        pipe,
                        RENEW,
                        [keys.meta, keys.lease, keys.want],
                        [owner, fence, self.lease_ttl_ms],
                    )
                return await pipe.execute()

        replies = await self._call(renew)
        return {sid: _RENEWAL[int(r)] for sid, r in zip(leases, replies, strict=True)}  # type: ignore[misc]  # replies are ints

    async def release_lease(self, session_id: str, owner: str, fence: int) -> None:
        keys = self._keys(session_id)
        await self._call(
            lambda: _eval(self._redis, RELEASE, [keys.meta, keys.lease], [owner, fence])
        )

    async def ping(self) -> bool:
        try:
            return bool(await asyncio.wait_for(self._redis.ping(), timeout=0.5))
        except (TimeoutError, *_UNREACHABLE):
            return False

    # --- appends -----------------------------------------------------------

    async def append(self, session_id: str, records: list[Record], fence: int) -> list[int]:
        if not records:
            return []
        seqs = [record.seq for record in records]
        if seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            raise SequenceConflict(f"{session_id}: batch seqs {seqs[:3]}... are not consecutive")
        future = asyncio.get_running_loop().create_future()
        bulk: dict[str, bytes] = {}
        args = _append_args(records, fence, self._window, bulk)
        self._pending.append(_Append(session_id, self._keys(session_id), args, future))
        if len(self._flushers) < FLUSHERS:
            task = asyncio.get_running_loop().create_task(self._flush())
            self._flushers.add(task)
            task.add_done_callback(self._flushers.discard)
        await future
        if self._sealer is not None:
            self._sealer.appended(session_id, bulk)
        return seqs

    async def seal_media(self) -> None:
        """Seal every session's waiting bulk now, however little (shutdown, tests)."""
        if self._sealer is not None:
            await self._sealer.drain()

    async def swap_bulk(self, session_id: str, refs: dict[str, bytes]) -> int:
        """A segment holds these bulk values now: keep only their references.
        The segment is listed first, for its session's delete, which must
        find it even after every reference to it was trimmed or compacted
        away (a crash between lists a segment nothing names: deleted too)."""
        keys = self._keys(session_id)
        pairs = [item for name, ref in refs.items() for item in (name, ref)]
        named = {decode_ref(ref).digest.hex() for ref in refs.values()}

        async def list_and_swap() -> int:
            if named:
                await self._redis.sadd(keys.segments, *named)
            return int(await _eval(self._redis, SWAP_BULK, [keys.bulk], pairs))

        return await self._call(list_and_swap)

    async def _flush(self) -> None:
        while self._pending:
            group, self._pending = self._pending, []
            try:
                replies = await self._call(functools.partial(self._send, group))
            except StorageUnavailable as exc:
                replies = [exc] * len(group)
            for op, reply in zip(group, replies, strict=True):
                if op.future.done():
                    continue
                if isinstance(reply, ResponseError):
                    op.future.set_exception(_refusal(op.session_id, reply))
                elif isinstance(reply, Exception):
                    op.future.set_exception(reply)
                else:
                    op.future.set_result(None)

    async def _send(self, group: list[_Append]) -> list[Any]:
        commands = []
        for op in group:
            keys = op.keys
            commands.append(
                ("EVALSHA", APPEND.sha, 4, keys.meta, keys.log, keys.bulk, keys.eids, *op.args)
            )
            # If this send fails midway, a batch may land without its reply:
            # the next send asks the script to recognise it.
            op.args[_RETRY_ARG] = 1
        if self._pipes is not None:
            pipe = self._pipes.pop()
            try:
                replies = await pipe.execute(commands)
            finally:
                self._pipes.append(pipe)
        else:
            async with self._redis.pipeline(transaction=False) as pipeline:
                for command in commands:
                    pipeline.execute_command(*command)
                replies = await pipeline.execute(raise_on_error=False)
        if any(isinstance(reply, NoScriptError) for reply in replies):
            raise NoScriptError("NOSCRIPT")  # resent whole: landed batches are recognised
        return replies

    async def archive_old(self, session_id: str) -> None:
        """Move the records long behind the latest snapshot into an archive
        segment (``sessions/log/redis_archive.py``), once enough wait."""
        if self._media is None:
            return
        media, keys = self._media, self._keys(session_id)
        marks = await self._call(
            lambda: self._redis.hmget(keys.meta, "snapshot_seq", "archived_upto")
        )
        upto, done = int(marks[0] or 0) - 1, int(marks[1] or 0)
        if upto - done < redis_archive.ARCHIVE_RECORDS:
            return

        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrange(keys.log, f"{done + 1}-0", f"{upto}-0")
                pipe.hgetall(keys.bulk)
                return await pipe.execute()

        entries, bulk = await self._call(fetch)
        if not entries:
            return
        data, owned = await asyncio.to_thread(redis_archive.build, session_id, entries, bulk)
        blob = await asyncio.to_thread(media.put_sync, data, redis_archive.ARCHIVE_TYPE)
        first, last = (int(entries[i][0].split(b"-")[0]) for i in (0, -1))
        listed = redis_archive.encode_range(first, last, blob.digest, blob.size)
        await self._call(
            lambda: _eval(
                self._redis,
                ARCHIVE,
                [keys.meta, keys.log, keys.bulk, keys.archive],
                [done, last, listed, *owned],
            )
        )

    # --- reads -------------------------------------------------------------

    async def latest_snapshot(self, session_id: str) -> int:
        meta = self._keys(session_id).meta
        seq = await self._call(lambda: self._redis.hget(meta, "snapshot_seq"))
        return int(seq or 0)

    async def read(self, session_id: str, after_seq: int = 0) -> list[Record]:
        keys = self._keys(session_id)

        async def fetch() -> list[Record]:
            start = max(after_seq, 1)  # one entry more than asked: a twin needs its GA event
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrange(keys.log, f"{start}-0", "+")
                pipe.hgetall(keys.bulk)
                pipe.exists(keys.meta)
                pipe.hmget(
                    keys.meta, "archived_upto", "trimmed_upto", "compacted_upto", "media_expired"
                )
                pipe.lrange(keys.archive, 0, -1)
                entries, bulk, exists, marks, listed = await pipe.execute()
            if not exists:
                raise UnknownSession(session_id)
            if self._segments is None:
                return [r for r in _decode(session_id, entries, bulk) if r.seq > after_seq]
            if self._sealer is not None:  # a crash came before these were sealed
                self._sealer.adopt(session_id, _unsealed(bulk))
            segments = self._segments
            archived_upto, trimmed, compacted, expired = (int(mark or 0) for mark in marks)

            def decode() -> list[Record]:  # the segments are files: off the event loop
                rows, values = entries, bulk
                if start <= archived_upto:
                    old, old_bulk = _archived(
                        session_id, segments, redis_archive.ranges(listed), start
                    )
                    redis_archive.drop_retained(old_bulk, trimmed, compacted)
                    if expired:  # --media-retention-s deleted what it named
                        old_bulk.clear()
                    rows, values = old + entries, {**old_bulk, **bulk}
                return _decode(session_id, rows, _ResolvingBulk(session_id, values, segments))

            records = await asyncio.to_thread(decode)
            return [r for r in records if r.seq > after_seq]

        return await self._call(fetch)

    async def read_open_sessions(self) -> dict[str, list[Record]]:
        rows = await self.sessions(open_only=True)
        return {row.session_id: await self.read(row.session_id) for row in rows}

    # --- retention ---------------------------------------------------------

    async def _drop(self, session_id: str, mark: str, prefix: str, upto: int) -> int:
        keys = self._keys(session_id)
        return int(
            await self._call(
                lambda: _eval(self._redis, DROP_BULK, [keys.meta, keys.bulk], [mark, prefix, upto])
            )
        )

    async def trim(self, session_id: str, upto_server_event_seq: int) -> int:
        return await self._drop(session_id, "trimmed_upto", "o", upto_server_event_seq)

    async def compact_audio(self, session_id: str, upto_seq: int) -> int:
        return await self._drop(session_id, "compacted_upto", "a", upto_seq)

    async def close(self) -> None:
        await self.seal_media()
        if self._flushers:
            await asyncio.gather(*self._flushers, return_exceptions=True)
        for pipe in self._pipes or ():
            pipe.close()
        await self._redis.aclose()


def _eval(client: Any, script: redis_scripts.LuaScript, keys: list[str], args: list[Any]) -> Any:
    """``EVALSHA``: a coroutine on a client, a queued command on a pipeline."""
    return client.evalsha(script.sha, len(keys), *keys, *args)


def _row(session_id: str, meta: dict[bytes, bytes]) -> SessionRow:
    def number(field: bytes) -> int:
        return int(meta.get(field, b"0"))

    return SessionRow(
        session_id=session_id,
        fence=number(b"fence"),
        owner=meta.get(b"owner", b"").decode(),
        last_seq=number(b"last_seq"),
        trimmed_upto=number(b"trimmed_upto"),
        closed=meta.get(b"closed") == b"1",
        last_ts_ms=number(b"last_ts_ms"),
        media_expired=meta.get(b"media_expired") == b"1",
    )


def _media_owner(header: bytes) -> str | None:
    """The session a media segment or an archive belongs to, from its first
    bytes. An archive (``redis_archive.Archive``) is a msgpack array of
    three whose first item is the session id and second the entries array;
    both are checked, so a blob that only happens to start like one is kept."""
    return segment_owner(header) or _archive_owner(header)


def _archive_owner(header: bytes) -> str | None:
    if len(header) < 2 or header[0] != 0x93:  # fixarray of 3
        return None
    tag = header[1]
    if 0xA0 <= tag <= 0xBF:  # fixstr
        start, length = 2, tag & 0x1F
    elif tag == 0xD9 and len(header) >= 3:  # str 8
        start, length = 3, header[2]
    elif tag == 0xDA and len(header) >= 4:  # str 16
        start, length = 4, int.from_bytes(header[2:4], "big")
    else:
        return None
    end = start + length
    if length == 0 or end >= len(header):
        return None
    if not (0x90 <= header[end] <= 0x9F or header[end] in (0xDC, 0xDD)):  # the entries array
        return None
    try:
        return header[start:end].decode()
    except UnicodeDecodeError:
        return None


def _unsealed(bulk: dict[bytes, bytes]) -> dict[str, bytes]:
    """The bulk values still held whole (``a<seq>``, ``u<seq>``, ``o<n>``)."""
    return {name.decode(): value for name, value in bulk.items() if name[:1] in b"aou"}


def _named_media(
    session_id: str,
    segments: SegmentReader,
    bulk: dict[bytes, bytes],
    listed: list[bytes],
    sealed: set[bytes],
    *,
    with_archives: bool,
) -> Callable[[], set[str]]:
    """The digests of the segments sealed for a session (``sealed``) and
    those its references name, in its bulk and in its archives (and of the
    archives themselves, ``with_archives``); returned as a blocking call,
    for a worker thread (archives are files)."""

    def named() -> set[str]:
        digests = redis_archive.media_digests(bulk.items())
        digests |= {digest.decode() for digest in sealed}
        for archived in redis_archive.ranges(listed):
            if with_archives:
                digests.add(archived.digest.hex())
            try:
                data = segments.whole(session_id, "archive", archived.digest, archived.size)
            except MediaUnavailable:  # gone already: what it named cannot be found
                continue
            digests |= redis_archive.archive_media(data)
        return digests

    return named


def _archived(
    session_id: str, segments: SegmentReader, listed: list[redis_archive.ArchivedRange], start: int
) -> tuple[list, dict[bytes, bytes]]:
    """The archived entries from ``start`` on, oldest first, and their bulk. Blocking."""
    entries: list = []
    bulk: dict[bytes, bytes] = {}
    for archived in listed:
        if archived.last < start:
            continue
        what = f"archive of seqs {archived.first}-{archived.last}"
        data = segments.whole(session_id, what, archived.digest, archived.size)
        rows, values = redis_archive.entries_of(data, start)
        entries += rows
        bulk.update(values)
    return entries, bulk


class _ResolvingBulk:
    """A read's bulk hash, where a sealed reference (``A<seq>``, ``O<n>``)
    stands in for a value: ``get`` of the value's own name gives the bytes
    its segment holds, read only for the records the read returns. Blocking."""

    def __init__(self, session_id: str, bulk: dict[bytes, bytes], segments: SegmentReader) -> None:
        self._session_id = session_id
        self._bulk = bulk
        self._segments = segments

    def get(self, name: bytes) -> bytes | None:
        value = self._bulk.get(name)
        if value is not None:
            return value
        sealed = name.upper()
        ref = self._bulk.get(sealed)
        if ref is None:
            return None
        return self._segments.resolve(self._session_id, sealed.decode(), ref)


def _decode(
    session_id: str, entries: list, bulk: dict[bytes, bytes] | _ResolvingBulk
) -> list[Record]:
    rows = []
    for _entry_id, fields in entries:
        record = record_decoder.decode(fields[b"r"])
        body = record.body
        payload = bulk.get(b"o%d" % body.server_event_seq) if isinstance(body, OutBody) else None
        audio = bulk.get((b"u%d" if record.kind == "unit" else b"a%d") % record.seq)
        rows.append((record, payload, None, audio))
    return decode_records(session_id, rows)
