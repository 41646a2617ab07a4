"""The deployments the chaos bench breaks, and the faults each can suffer.

``SqliteDeployment``: one server on a SQLite file. It is killed with
``kill -9`` and restarted on the same file and port; its disk fills (the
server's file-size limit is lowered, live, to the size its files have, so
every write that would grow them fails as on a full disk); its database is
revoked (``chattr +i``: immutable even to root, where ``chmod`` is not).

``ReplicaDeployment``: two servers sharing one Redis. A replica is killed
with ``kill -9`` (its sessions resume on the other one) and restarted; Redis
is restarted on the same port and append-only file.

Every fault is bounded: ``inject`` returns once the deployment is whole again.
Starting a server blocks on its health check, so it runs in a thread and the
clients keep streaming meanwhile.
"""

from __future__ import annotations

import asyncio
import random
import resource
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Protocol

from duplex_bench.redis_process import RedisServer
from duplex_bench.server_process import ServerProcess
from duplex_server.surface import Record, RedisLog, SqliteReader

# Every journaled event, both spellings: the witness checks the journal is contiguous.
WS_PATH = "/v1/realtime?duplex=1&events=both"
LEASE_TTL_MS = 1000  # a dead replica's sessions move after this


class Deployment(Protocol):
    name: str
    kinds: tuple[str, ...]  # the faults it can suffer (socket drops are the driver's)
    skipped: dict[str, str]  # fault -> why this machine cannot inject it

    def urls(self) -> list[str]: ...

    async def start(self) -> None: ...

    async def inject(self, kind: str, hold_s: float) -> None: ...

    def stop(self) -> None: ...

    async def records(self, session_id: str) -> list[Record]: ...

    def close(self) -> None: ...


class SqliteDeployment:
    name = "sqlite"

    def __init__(self, directory: Path, rng: random.Random) -> None:
        self.db = directory / "chaos.db"
        self.server = ServerProcess(f"sqlite:{self.db}", ws_path=WS_PATH)
        self.kinds: tuple[str, ...] = ("kill9", "disk_full")
        self.skipped: dict[str, str] = {}
        if (reason := _chattr_unavailable(directory)) is None:
            self.kinds += ("revoke",)
        else:
            self.skipped["revoke"] = reason

    def urls(self) -> list[str]:
        return [self.server.ws_url]

    async def start(self) -> None:
        await asyncio.to_thread(self.server.start)

    async def inject(self, kind: str, hold_s: float) -> None:
        if kind == "kill9":
            self.server.kill9()
            await asyncio.sleep(hold_s)
            await asyncio.to_thread(self.server.start)
        elif kind == "disk_full":
            full = max(path.stat().st_size for path in self._files() if path.exists())
            # The soft limit only: lowering the hard one could not be undone
            # without CAP_SYS_RESOURCE.
            soft, hard = resource.prlimit(self.server.pid, resource.RLIMIT_FSIZE)
            resource.prlimit(self.server.pid, resource.RLIMIT_FSIZE, (full, hard))
            try:
                await asyncio.sleep(hold_s)
            finally:
                resource.prlimit(self.server.pid, resource.RLIMIT_FSIZE, (soft, hard))
        elif kind == "revoke":
            _chattr("+i", *self._files())
            try:
                await asyncio.sleep(hold_s)
            finally:
                _chattr("-i", *self._files())
        else:
            raise ValueError(f"sqlite deployment has no fault {kind!r}")

    def _files(self) -> list[Path]:
        """The database and its WAL: what a full disk or a revocation hits."""
        return [self.db, self.db.with_name(self.db.name + "-wal")]

    def stop(self) -> None:
        self.server.stop()

    def close(self) -> None:
        """Nothing outlives the server here (the file goes with the directory)."""

    async def records(self, session_id: str) -> list[Record]:
        reader = SqliteReader(self.db)
        try:
            return reader.records(session_id)
        finally:
            reader.close()


class ReplicaDeployment:
    name = "replicas"
    kinds: tuple[str, ...] = ("replica_kill", "redis_restart")

    def __init__(self, directory: Path, rng: random.Random) -> None:
        self.rng = rng
        self.skipped: dict[str, str] = {}
        self.redis = RedisServer(directory / "redis")
        self.prefix = f"chaos{uuid.uuid4().hex[:8]}"
        self.replicas = [
            ServerProcess(
                self.redis.url,
                ws_path=WS_PATH,
                redis_prefix=self.prefix,
                replica_id=name,
                lease_ttl_ms=LEASE_TTL_MS,
            )
            for name in ("replica-a", "replica-b")
        ]

    def urls(self) -> list[str]:
        return [replica.ws_url for replica in self.replicas]

    async def start(self) -> None:
        await asyncio.to_thread(self.redis.start)
        for replica in self.replicas:
            await asyncio.to_thread(replica.start)

    async def inject(self, kind: str, hold_s: float) -> None:
        if kind == "replica_kill":
            victim = self.rng.choice(self.replicas)
            victim.kill9()
            await asyncio.sleep(hold_s)
            await asyncio.to_thread(victim.start)
        elif kind == "redis_restart":
            await asyncio.to_thread(self.redis.stop)
            await asyncio.sleep(hold_s)
            await asyncio.to_thread(self.redis.start)
        else:
            raise ValueError(f"replica deployment has no fault {kind!r}")

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()

    async def records(self, session_id: str) -> list[Record]:
        log = RedisLog(self.redis.url, prefix=self.prefix)
        try:
            return await log.read(session_id)
        finally:
            await log.close()

    def close(self) -> None:
        self.redis.stop()


def _chattr(flag: str, *paths: Path) -> None:
    subprocess.run(["chattr", flag, *map(str, paths)], check=True, capture_output=True)


def _chattr_unavailable(directory: Path) -> str | None:
    """Why ``chattr +i`` cannot revoke a file here (None: it can)."""
    if shutil.which("chattr") is None:
        return "chattr is not installed (Debian package e2fsprogs)"
    probe = directory / "chattr-probe"
    probe.write_bytes(b"")
    try:
        _chattr("+i", probe)
        _chattr("-i", probe)
    except subprocess.CalledProcessError as exc:
        return f"chattr +i refused here: {exc.stderr.decode(errors='replace').strip()}"
    finally:
        probe.unlink(missing_ok=True)
    return None
