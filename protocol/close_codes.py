"""WebSocket close codes the server ends a session's socket with.

The standard ones (RFC 6455 section 7.4.1) keep their meaning; 4000-4999 is
the application range: the codes a duplex-aware client branches on to know
whether to resume elsewhere, retry, or give up."""

from __future__ import annotations

import enum


class CloseCode(enum.IntEnum):
    NORMAL = 1000  # the session closed (session.closed was the last event)
    POLICY_VIOLATION = 1008  # authentication failed
    INTERNAL_ERROR = 1011  # a server bug ended the session's actor
    SERVICE_RESTART = 1012  # this process hands the session over: resume it
    TRY_AGAIN_LATER = 1013  # the session could not be opened (capacity, storage)
    REPLACED = 4000  # a newer socket resumed the session on this replica
    MOVED = 4001  # another replica took the session over (or asked for it)
