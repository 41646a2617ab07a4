"""Session ids and resume tokens.

Tokens are 128-bit random, handed to the client once and kept only as a
SHA-256 hash; comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


def new_session_id() -> str:
    return "sess_" + secrets.token_urlsafe(18)


def new_resume_token() -> str:
    return secrets.token_urlsafe(16)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, token_hash: str | None) -> bool:
    if token_hash is None:
        return False
    return hmac.compare_digest(hash_token(token), token_hash)
