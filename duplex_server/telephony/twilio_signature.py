"""Is this request Twilio's? Its ``X-Twilio-Signature``, checked.

Twilio signs the URL it asked for (with the form fields of a webhook, or
nothing more for a media stream's ``wss://`` URL) with the account's auth
token. Behind a reverse proxy the server sees another URL (``http://internal
:8000``), so the one Twilio signed is rebuilt from the proxy's ``Forwarded``
or ``X-Forwarded-*`` headers. Trusting those headers gives nothing away: a
forged host or scheme only changes the URL the signature must match, and the
signature still takes the auth token to make. The HMAC itself is the twilio
package's (an optional extra), never ours.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from starlette.requests import HTTPConnection

SIGNATURE_HEADER = "x-twilio-signature"
_SECURE = {"https": True, "wss": True, "http": False, "ws": False}
_DEFAULT_PORT = {"http": "80", "ws": "80", "https": "443", "wss": "443"}
# One ``key=value`` pair of RFC 7239, its value a token or a quoted string,
# and the separator after it (";" within an element, "," between elements).
_HAS_PORT = re.compile(r":\d*$")
_FORWARDED_PAIR = re.compile(r'\s*([^\s=;,]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;,\s]*)\s*([;,]?)')


def signed_url(connection: HTTPConnection) -> str:
    """The URL Twilio requested, as it signed it: the proxy's scheme and host
    where it says them, the path and query string as they arrived."""
    scope = connection.scope
    websocket = scope["type"] == "websocket"
    proto, host = _forwarded(connection.headers)
    seen = urlsplit(str(connection.url))
    scheme = _scheme(proto, scope.get("scheme", "http"), websocket)
    netloc = _with_port(host or seen.netloc, connection.headers.get("x-forwarded-port"), scheme)
    query = scope.get("query_string", b"").decode("latin-1")
    return urlunsplit((scheme, netloc, _raw_path(scope), query, ""))


def verify_request(connection: HTTPConnection, params: Mapping[str, str], auth_token: str) -> bool:
    """Whether ``X-Twilio-Signature`` signs this connection's URL and
    ``params`` (a webhook's form fields; none for a media stream)."""
    signature = connection.headers.get(SIGNATURE_HEADER)
    if not signature:
        return False
    validator = _validator(auth_token)
    return bool(validator.validate(signed_url(connection), dict(params), signature))


def require_twilio() -> None:
    """Raises ValueError unless the twilio package imports: telephony is an
    optional extra, and a server told to take Twilio's calls without it is
    refused at start rather than failing its first call."""
    try:
        import twilio.request_validator  # noqa: F401
    except ModuleNotFoundError as exc:
        raise ValueError(
            "--twilio-auth-token needs the twilio package: pip install 'duplex-server[telephony]'"
        ) from exc


def _validator(auth_token: str) -> Any:
    """twilio's RequestValidator, imported here: a server without the
    optional extra must still start (``require_twilio`` checks it there)."""
    require_twilio()
    from twilio.request_validator import RequestValidator

    return RequestValidator(auth_token)


def _forwarded(headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The client-facing scheme and host the proxy reports: RFC 7239's
    ``Forwarded`` (its first element: the proxy nearest the client), else
    the first of each ``X-Forwarded-*`` list."""
    pairs = _first_forwarded_element(headers.get("forwarded", ""))
    proto = pairs.get("proto") or _first(headers.get("x-forwarded-proto"))
    host = pairs.get("host") or _first(headers.get("x-forwarded-host"))
    return proto, host


def _first_forwarded_element(header: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for match in _FORWARDED_PAIR.finditer(header):
        key, value, separator = match.groups()
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        pairs.setdefault(key.lower(), value)
        if separator != ";":
            break
    return pairs


def _first(header: str | None) -> str | None:
    if header is None:
        return None
    return header.split(",", 1)[0].strip() or None


def _scheme(proto: str | None, seen: str, websocket: bool) -> str:
    """The proxy's scheme (a name it has no business sending: the one seen),
    as a WebSocket's ws/wss where the proxy says http/https: Twilio signs
    the ``wss://`` URL of a media stream."""
    secure = _SECURE.get((proto or "").lower(), _SECURE.get(seen, False))
    if websocket:
        return "wss" if secure else "ws"
    return "https" if secure else "http"


def _with_port(netloc: str, port: str | None, scheme: str) -> str:
    """``netloc`` with the proxy's ``X-Forwarded-Port``, where it names none
    and the port is not the scheme's own."""
    port = _first(port)
    if port is None or port == _DEFAULT_PORT[scheme] or _HAS_PORT.search(netloc):
        return netloc
    return f"{netloc}:{port}"


def _raw_path(scope: Mapping[str, Any]) -> str:
    """The path's bytes as they arrived: a re-encoded decoded path may not be
    the one Twilio signed (``%2F`` against ``/``)."""
    raw = scope.get("raw_path")
    if raw:
        return bytes(raw).split(b"?", 1)[0].decode("latin-1")
    return quote(scope.get("root_path", "") + scope["path"])
