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


def resume_allowed(token: str, current_hash: str | None, unconfirmed_hash: str | None) -> bool:
    """The session's current token, or the one a resume presented while the
    client has not yet spoken on the socket it opened: a ``session.resumed``
    lost with its socket (a crash, a drop) must not lock the client out of a
    session whose new token it never received. Both compared in constant time."""
    current = token_matches(token, current_hash)
    unconfirmed = token_matches(token, unconfirmed_hash)
    return current or unconfirmed
