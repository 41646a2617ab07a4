"""What ``POST /v1/realtime/calls`` was sent: the SDP offer, and the session it asks for.

OpenAI takes the offer two ways: the bare SDP (``Content-Type:
application/sdp``), or a multipart form with ``sdp`` and ``session`` (the
session config, JSON, applied before the first event). Both are read here,
bounded by ``--rtc-max-offer-bytes`` before anything is parsed, and checked
before a peer connection is made for them: an offer that is no SDP, has no
audio, or offers no Opus is refused with a clear 400 (a browser always
offers Opus; anything else is not a call this server can carry).

A new offer may continue a session whose peer connection failed (our
extension, PROTOCOL.md): ``session_id``, ``resume_token`` and
``last_received_server_event_seq`` in the ``session`` object, or as query
parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import msgspec
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import Message

from duplex_server.http_body import read_limited
from protocol.client_events import SessionResume
from protocol.codec import drop_optional_nulls
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate

# What a resuming offer names, beside (or instead of) the session's config.
RESUME_FIELDS = ("session_id", "resume_token", "last_received_server_event_seq")


@dataclasses.dataclass(frozen=True)
class CallRequest:
    sdp: str
    session: SessionUpdate | None = None  # the multipart ``session``
    resume: SessionResume | None = None  # the session this offer continues


class UnsupportedContentType(ProtocolError):
    def __init__(self, content_type: str) -> None:
        super().__init__(
            "unsupported_content_type",
            f"send the offer as application/sdp or multipart/form-data, not {content_type!r}",
        )


async def read_call_request(request: Request, limit: int) -> CallRequest:
    """The request's offer, config and resume; a ProtocolError (400) for a
    body that is none of OpenAI's two forms. ``BodyTooLarge`` past ``limit``."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await read_limited(request, limit)
    if content_type == "application/sdp":
        sdp, session_json = _text(body, "the offer"), None
    elif content_type == "multipart/form-data":
        sdp, session_json = await _form(request, body)
    else:
        raise UnsupportedContentType(content_type)
    check_offer(sdp)
    raw = _session_object(session_json)
    resume = _resume(raw, request.query_params)
    return CallRequest(sdp=sdp, session=_session(raw), resume=resume)


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("invalid_offer", f"{what} is not UTF-8 text", param="sdp") from None


async def _form(request: Request, body: bytes) -> tuple[str, str | None]:
    """``sdp`` and ``session`` of a multipart body already read (and bounded)."""

    async def replay() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    whole = Request(request.scope, replay)
    try:
        async with whole.form(max_files=2, max_fields=8) as form:
            fields = {name: await _field(value) for name, value in form.multi_items()}
    except HTTPException as unreadable:  # Starlette's parser: no boundary, too many parts
        raise ProtocolError("invalid_offer", f"unreadable form: {unreadable.detail}") from None
    unknown = set(fields) - {"sdp", "session"}
    if unknown:
        raise ProtocolError(
            "invalid_offer",
            f"unknown form fields {sorted(unknown)}: send sdp and session",
            param=sorted(unknown)[0],
        )
    if "sdp" not in fields:
        raise ProtocolError("invalid_offer", "the form has no sdp field", param="sdp")
    return fields["sdp"], fields.get("session")


async def _field(value: str | UploadFile) -> str:
    if isinstance(value, str):
        return value
    return _text(await value.read(), value.filename or "a form file")


def check_offer(sdp: str) -> None:
    """Refuse an offer this server cannot answer, before any peer
    connection: not SDP, no audio section, or no Opus in it."""
    lines = [line.strip() for line in sdp.splitlines()]
    if not lines or lines[0] != "v=0":
        raise ProtocolError("invalid_offer", "the offer is not an SDP (no v=0 first)", param="sdp")
    audio = _section(lines, "m=audio")
    if audio is None:
        raise ProtocolError(
            "invalid_offer", "the offer has no audio (m=audio) section", param="sdp"
        )
    if not any(
        line.lower().startswith("a=rtpmap:") and " opus/48000" in line.lower() for line in audio
    ):
        raise ProtocolError(
            "unsupported_codec",
            "the offer's audio has no Opus (opus/48000): this server speaks Opus only",
            param="sdp",
        )


def _section(lines: list[str], media: str) -> list[str] | None:
    """The lines of the first ``m=`` section of ``media``'s kind."""
    start = next((i for i, line in enumerate(lines) if line.startswith(media)), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("m=")), len(lines))
    return lines[start:end]


def _session_object(text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        raw = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ProtocolError(
            "invalid_json", f"session is not JSON: {exc}", param="session"
        ) from None
    if not isinstance(raw, dict):
        raise ProtocolError("invalid_value", "session must be a JSON object", param="session")
    return raw


def _session(raw: dict[str, Any]) -> SessionUpdate | None:
    config = {key: value for key, value in raw.items() if key not in RESUME_FIELDS}
    if not config:
        return None
    try:
        return msgspec.convert(drop_optional_nulls(config, SessionUpdate), SessionUpdate)
    except msgspec.ValidationError as exc:
        raise ProtocolError("invalid_value", f"session: {exc}", param="session") from None


def _resume(raw: dict[str, Any], query: Mapping[str, str]) -> SessionResume | None:
    """The session the offer continues: named in ``session`` or the query."""
    named = {key: raw[key] for key in RESUME_FIELDS if key in raw}
    named |= {key: query[key] for key in RESUME_FIELDS if key in query and key not in named}
    if not named:
        return None
    try:
        # not strict: a query parameter's seq is text ("412")
        return msgspec.convert(named, SessionResume, strict=False)
    except msgspec.ValidationError as exc:
        raise ProtocolError("invalid_value", f"resume: {exc}", param="session_id") from None
