"""A bare pipelined Redis connection for the append path.

redis-py's pipeline machinery (a timeout context and a parse call per reply,
Python-side command objects) cost more CPU than Redis spent running the
append scripts (``bench sessions --store redis``). Appends need none of it:
pack every command with hiredis, write them at once, feed the replies to a
hiredis reader. Everything else keeps using redis-py.

Only plain ``redis://`` URLs get a pipe; other schemes (TLS, sockets,
sentinel) use redis-py's pipeline.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import unquote, urlparse

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError


class _ReplyError(ResponseError):
    """An error reply; turned into redis-py's classes so callers see one kind."""


def _error(reply: _ReplyError) -> ResponseError:
    text = str(reply)
    return NoScriptError(text) if text.startswith("NOSCRIPT") else ResponseError(text)


class RedisPipe:
    def __init__(self, url: str, timeout_s: float) -> None:
        where = urlparse(url)
        self.host = where.hostname or "127.0.0.1"
        self.port = where.port or 6379
        self.db = int(where.path.lstrip("/") or 0)
        self.username = unquote(where.username) if where.username else None
        self.password = unquote(where.password) if where.password else None
        self.timeout_s = timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._parser = hiredis.Reader(replyError=_ReplyError)

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), self.timeout_s
        )
        self._parser = hiredis.Reader(replyError=_ReplyError)
        setup: list[tuple[Any, ...]] = []
        if self.password is not None:
            auth = ("AUTH", self.username, self.password) if self.username else None
            setup.append(auth or ("AUTH", self.password))
        if self.db:
            setup.append(("SELECT", self.db))
        for reply in await self._exchange(setup):
            if isinstance(reply, ResponseError):
                raise reply

    async def execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Replies in order; an error reply is returned as its exception, not raised.
        A broken connection raises redis-py's ``ConnectionError``."""
        try:
            if self._writer is None:
                await self._connect()
            return await self._exchange(commands)
        except (OSError, EOFError, TimeoutError, hiredis.ProtocolError) as exc:
            self.close()
            raise RedisConnectionError(f"redis {self.host}:{self.port}: {exc!r}") from exc

    async def _exchange(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        assert self._reader is not None and self._writer is not None
        if not commands:
            return []
        self._writer.write(b"".join(hiredis.pack_command(command) for command in commands))
        replies: list[Any] = []
        while len(replies) < len(commands):
            reply = self._parser.gets()
            if reply is False:
                data = await asyncio.wait_for(self._reader.read(1 << 16), self.timeout_s)
                if not data:
                    raise EOFError("connection closed by redis")
                self._parser.feed(data)
                continue
            replies.append(_error(reply) if isinstance(reply, _ReplyError) else reply)
        return replies

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
