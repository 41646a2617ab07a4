"""Session ids and resume tokens.

Tokens are 128-bit random, handed to the client once and kept only as a
SHA-256 hash; comparison is constant-time.
"""

from __future__ import annotations

import secrets

from duplex_server.sessions.core.token_hashes import hash_token, token_matches

__all__ = ["hash_token", "new_resume_token", "new_session_id", "token_matches"]


def new_session_id() -> str:
    return "sess_" + secrets.token_urlsafe(18)


def new_resume_token() -> str:
    return secrets.token_urlsafe(16)
