"""Optional API-key check for HTTP and WebSocket requests.

Browsers cannot set headers on a WebSocket, so the key is also accepted as
the ``openai-insecure-api-key.<key>`` subprotocol, as OpenAI's own endpoint does.
"""

from __future__ import annotations

import hmac

from starlette.requests import HTTPConnection

SUBPROTOCOL_PREFIX = "openai-insecure-api-key."


def presented_key(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    for proto in conn.scope.get("subprotocols", []):
        if proto.startswith(SUBPROTOCOL_PREFIX):
            return proto[len(SUBPROTOCOL_PREFIX) :]
    return None


def is_authorized(conn: HTTPConnection, api_key: str | None) -> bool:
    if api_key is None:
        return True
    key = presented_key(conn)
    return key is not None and hmac.compare_digest(key.encode(), api_key.encode())
