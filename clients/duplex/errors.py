"""The client's exceptions: one base, three kinds."""

from __future__ import annotations


class DuplexClientError(Exception):
    """Base of every error this library raises."""


class DuplexProtocolError(DuplexClientError):
    """The server refused an event (``error``), or spoke outside the protocol."""

    def __init__(
        self,
        code: str,
        message: str,
        event_id: str | None = None,
        error_type: str = "invalid_request_error",
        param: str | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.event_id = event_id
        self.error_type = error_type
        self.param = param


class DuplexConnectionError(DuplexClientError):
    """The transport failed and could not be (re)established."""


class DuplexSessionClosedError(DuplexClientError):
    """The session is over (closed, expired, replaced, or dropped without reconnect)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"session closed: {reason}")
        self.reason = reason
