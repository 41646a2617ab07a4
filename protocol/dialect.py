"""Which generation of OpenAI's event names a connection speaks (PROTOCOL.md,
"One dialect per connection").

The log journals every outbound event once, in the GA spelling, with the
beta twin of each renamed event right after it. What a socket receives is a
projection of that journal: a GA connection skips the beta twins, a beta
connection skips the GA-only names and gets assistant content in beta's
spelling, ``?events=both`` gets everything as journaled. Keeping the
projection at the socket's edge means a resume may switch dialects and the
log stays one truth.
"""

from __future__ import annotations

import enum

import msgspec

from protocol.server_events import BETA_TWIN, ItemDone


class Dialect(enum.Enum):
    GA = "ga"
    BETA = "beta"
    BOTH = "both"


def negotiate(events: str | None, openai_beta_header: str | None) -> Dialect:
    """``?events=ga|beta|both`` wins; else ``OpenAI-Beta: realtime=v1`` means
    beta; else GA, OpenAI's current API."""
    if events:
        try:
            return Dialect(events.lower())
        except ValueError:
            pass
    if openai_beta_header and "realtime=v1" in openai_beta_header.replace(" ", ""):
        return Dialect.BETA
    return Dialect.GA


def _tag(cls: type[msgspec.Struct]) -> bytes:
    return str(cls.__struct_config__.tag).encode()


BETA_ONLY = frozenset(_tag(beta) for beta in BETA_TWIN.values())
# GA names beta does not define: the GA half of each twin, and item.done.
GA_ONLY = frozenset(_tag(ga) for ga in BETA_TWIN) | {_tag(ItemDone)}
# Events whose items carry assistant content (output_audio / output_text in GA).
_WITH_ITEMS = frozenset(
    {
        b"response.created",
        b"response.done",
        b"response.output_item.added",
        b"response.output_item.done",
        b"conversation.item.created",
        b"conversation.item.retrieved",
    }
)
_BETA_PART = {"output_audio": "audio", "output_text": "text"}
_PREFIX = b'{"type":"'


def event_type(payload: bytes) -> bytes:
    """The ``type`` of an encoded server event (msgspec writes the tag
    first); b"" for anything else, which every dialect passes through."""
    if not payload.startswith(_PREFIX):
        return b""
    end = payload.find(b'"', len(_PREFIX))
    return payload[len(_PREFIX) : end] if end > 0 else b""


def present(payload: bytes, dialect: Dialect) -> bytes | None:
    """The journaled event as this connection receives it; None to skip it."""
    if dialect is Dialect.BOTH:
        return payload
    kind = event_type(payload)
    if dialect is Dialect.GA:
        return None if kind in BETA_ONLY else payload
    if kind in GA_ONLY:
        return None
    return _beta_parts(payload) if kind in _WITH_ITEMS else payload


def _beta_parts(payload: bytes) -> bytes:
    event = msgspec.json.decode(payload)
    items = [event.get("item")]
    response = event.get("response")
    if isinstance(response, dict):
        items.extend(response.get("output") or [])
    changed = False
    for item in items:
        if not isinstance(item, dict):
            continue
        for part in item.get("content") or []:
            spelled = _BETA_PART.get(part.get("type"))
            if spelled is not None:
                part["type"] = spelled
                changed = True
    return msgspec.json.encode(event) if changed else payload
