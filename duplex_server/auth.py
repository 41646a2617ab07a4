"""Who is calling: API keys, the principal each names, and its scopes.

A key is presented as ``Authorization: Bearer KEY`` or, since browsers
cannot set headers on a WebSocket, as the ``openai-insecure-api-key.KEY``
subprotocol, as OpenAI's own endpoint takes it. The server keeps only each
key's SHA-256 (``--api-keys-file``: one JSON object a line, written by
``duplex-server keys add``), so a leaked file gives no key away; a key is
looked up by its digest. A principal is the name a key carries, its scopes
(``realtime``: open and resume sessions; ``batch``: the batch routes;
``admin``: every session's log, details and metrics) and its session quota.
A server with no keys at all is open: everyone is the anonymous principal
with every scope.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import HTTPConnection

from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate

SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
SCOPES = ("realtime", "batch", "admin")
KEY_PREFIX = "dsk_"


@dataclass(frozen=True)
class Principal:
    name: str
    scopes: frozenset[str]
    max_sessions: int = 0  # live sessions it may hold at once (0: the server's cap only)

    def may(self, scope: str) -> bool:
        return scope in self.scopes

    def owns(self, owner: str | None) -> bool:
        """Whether a session opened by ``owner`` is this principal's to use:
        its own, or any for ``admin``."""
        return self.may("admin") or owner is None or owner == self.name


ANONYMOUS = Principal("anonymous", frozenset(SCOPES))


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyFileError(ValueError):
    """``--api-keys-file`` does not say what keys to accept."""


class KeyRing:
    def __init__(self, by_digest: dict[str, Principal]) -> None:
        self._by_digest = by_digest

    @property
    def open(self) -> bool:
        return not self._by_digest

    @classmethod
    def single(cls, key: str | None) -> KeyRing:
        """``--api-key``: one key, every scope."""
        if key is None:
            return cls({})
        return cls({key_digest(key): Principal("default", frozenset(SCOPES))})

    @classmethod
    def load(cls, path: str | Path) -> KeyRing:
        by_digest: dict[str, Principal] = {}
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise KeyFileError(f"--api-keys-file {path}: {exc.strerror}") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                scopes = frozenset(entry["scopes"])
                principal = Principal(entry["name"], scopes, int(entry.get("max_sessions", 0)))
                digest = str(entry["sha256"])
            except (ValueError, KeyError, TypeError) as exc:
                raise KeyFileError(f"--api-keys-file {path}:{number}: {exc!r}") from None
            if not scopes <= set(SCOPES) or len(digest) != 64:
                raise KeyFileError(f"--api-keys-file {path}:{number}: unknown scope or bad digest")
            by_digest[digest] = principal
        if not by_digest:
            raise KeyFileError(f"--api-keys-file {path}: no keys in the file")
        return cls(by_digest)

    def principal(self, key: str | None) -> Principal | None:
        """The principal ``key`` names; None for a missing or unknown key
        (anonymous on an open server)."""
        if self.open:
            return ANONYMOUS
        if key is None:
            return None
        return self._by_digest.get(key_digest(key))


def presented_key(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    for proto in conn.scope.get("subprotocols", []):
        if proto.startswith(SUBPROTOCOL_PREFIX):
            return proto[len(SUBPROTOCOL_PREFIX) :]
    return None


def caller(conn: HTTPConnection) -> Principal | None:
    """The principal of the request's key (None: missing or wrong key)."""
    keys: KeyRing = conn.app.state.keys
    return keys.principal(presented_key(conn))


def authenticate(conn: HTTPConnection) -> tuple[Principal | None, SessionUpdate | None]:
    """The caller, and the session config its key was minted with: a client
    secret (``ek_``) is used up here, the first time it is presented (by a
    WebSocket upgrade or a WebRTC offer)."""
    key = presented_key(conn)
    if key is not None and key.startswith(EPHEMERAL_PREFIX):
        grant = conn.app.state.ephemeral.take(key)
        return (grant.principal, grant.session) if grant is not None else (None, None)
    return caller(conn), None


def denial(principal: Principal | None, scope: str | None) -> tuple[int, ProtocolError] | None:
    """Why a caller is refused, with its HTTP status: 401 for a missing or
    wrong key, 403 for a key without ``scope``; None when it may go on.
    The REST routes, the client-secret route and the WebSocket upgrade each
    write the refusal in their own body, from this one decision."""
    if principal is None:
        return 401, ProtocolError("unauthorized", "missing or wrong API key")
    if scope is not None and not principal.may(scope):
        return 403, ProtocolError("forbidden", f"this key lacks the {scope!r} scope")
    return None


def new_key_entry(name: str, scopes: list[str], max_sessions: int) -> tuple[str, str]:
    """A fresh key and the line that makes a keys file accept it."""
    unknown = set(scopes) - set(SCOPES)
    if unknown:
        raise ValueError(f"unknown scopes {sorted(unknown)}; known: {', '.join(SCOPES)}")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    line = json.dumps(
        {
            "name": name,
            "sha256": key_digest(key),
            "scopes": sorted(scopes),
            "max_sessions": max_sessions,
        }
    )
    return key, line


EPHEMERAL_PREFIX = "ek_"
MAX_EPHEMERAL_KEYS = 10_000  # unused ones held at once (each expires)


@dataclass(frozen=True)
class Grant:
    """What an ephemeral key grants: one session, as the principal that
    minted it (realtime only), opened with the config it was minted with."""

    principal: Principal
    expires_at: float  # unix seconds
    session: SessionUpdate | None


class EphemeralKeys:
    """Short-lived keys minted for browsers (``POST /v1/realtime/client_secrets``),
    so a page never holds the real key. Each opens one session, once, before
    it expires. They live in this process: a page connects to the replica
    that minted its key, or mints another."""

    def __init__(
        self, limit: int = MAX_EPHEMERAL_KEYS, clock: Callable[[], float] = time.time
    ) -> None:
        self._limit = limit
        self._clock = clock
        self._by_digest: dict[str, Grant] = {}

    def mint(
        self, principal: Principal, ttl_s: float, session: SessionUpdate | None
    ) -> tuple[str, Grant]:
        """A new key and what it grants. Raises ``resource_exhausted`` while
        ``limit`` unexpired keys wait to be used."""
        now = self._clock()
        if len(self._by_digest) >= self._limit:
            self._by_digest = {d: g for d, g in self._by_digest.items() if g.expires_at > now}
        if len(self._by_digest) >= self._limit:
            raise ProtocolError(
                "resource_exhausted", "too many client secrets waiting; retry later"
            )
        realtime_only = Principal(principal.name, frozenset({"realtime"}), principal.max_sessions)
        grant = Grant(realtime_only, now + ttl_s, session)
        key = EPHEMERAL_PREFIX + secrets.token_urlsafe(32)
        self._by_digest[key_digest(key)] = grant
        return key, grant

    def take(self, key: str) -> Grant | None:
        """The key's grant, used up: None if unknown, used or expired."""
        grant = self._by_digest.pop(key_digest(key), None)
        if grant is None or grant.expires_at <= self._clock():
            return None
        return grant
