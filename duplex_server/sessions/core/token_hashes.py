"""A resume token as the log keeps it: only its SHA-256 hash, compared in
constant time. Pure, so that the core decides a resume and records an
attachment; the runtime makes the tokens (``log/tokens.py``)."""

from __future__ import annotations

import hashlib
import hmac


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, token_hash: str | None) -> bool:
    if token_hash is None:
        return False
    return hmac.compare_digest(hash_token(token), token_hash)
