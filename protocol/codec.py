"""Text frame <-> typed event.

``FrameDecoder.decode`` is the single gate every client frame passes: it
returns a typed event or raises :class:`ProtocolError` with the precise code
(and ``param`` for schema errors), so nothing untyped travels further in.
"""

from __future__ import annotations

import binascii
import functools
import re
from typing import Any, cast

import msgspec
import msgspec.inspect as mi

from protocol.client_events import CLIENT_EVENT_TYPES, AnyClientEvent, InputAudioAppend
from protocol.errors import ProtocolError
from protocol.server_events import AnyServerEvent, ServerEvent

DEFAULT_MAX_FRAME_BYTES = 4 * 1024 * 1024

_PATH = re.compile(r"- at `\$\.?(?P<path>[^`]*)`")
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `(?P<field>[^`]*)`")
_DATA_URL = re.compile(r"^data:[^;,]*(;base64)?,")


def _param_from(message: str) -> str | None:
    match = _PATH.search(message)
    if match is None:
        return None
    path = match.group("path").replace("[", ".").replace("]", "")
    if (unknown := _UNKNOWN_FIELD.match(message)) is not None:  # name the key itself
        path = f"{path}.{unknown.group('field')}" if path else unknown.group("field")
    return path or None


def _event_id_of(raw: object) -> str | None:
    if isinstance(raw, dict):
        event_id = raw.get("event_id")
        if isinstance(event_id, str):
            return event_id
    return None


def decode_base64(data: str, *, param: str, event_id: str | None) -> bytes:
    try:
        # strict_mode validates in C; b64decode(validate=True) runs a Python
        # regex over every audio frame first (7% of the server's CPU at load).
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(
            "invalid_audio", f"{param} is not valid base64: {exc}", param=param, event_id=event_id
        ) from None


def strip_data_url(data: str) -> str:
    return _DATA_URL.sub("", data, count=1)


MAX_NESTING = 64  # of arrays and objects in a client frame


def check_nesting(data: bytes) -> None:
    """Refuse a frame nested deeper than ``MAX_NESTING`` (``invalid_json``)
    before any decoder recurses into it. Counting brackets is a C-speed
    upper bound that clears every ordinary frame at once; only a frame with
    more brackets than that (say, text full of them) is measured exactly."""
    if data.count(b"[") + data.count(b"{") <= MAX_NESTING:
        return
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError("invalid_json", f"frame is not valid JSON: {exc}") from None
    except RecursionError:
        raw = None  # deeper than the decoder goes: deeper than the limit too
    else:
        if _depth(raw) <= MAX_NESTING:
            return
    raise ProtocolError("invalid_json", f"frame nests arrays and objects deeper than {MAX_NESTING}")


# Integers a session log can hold (its records are msgpack: int64 or uint64).
MIN_INT, MAX_INT = -(2**63), 2**64 - 1
_log_encoder = msgspec.msgpack.Encoder()


def check_integers(event: AnyClientEvent, data: bytes) -> None:
    """Refuse an event holding an integer no log can store (``invalid_event``),
    wherever it is: a tool's JSON Schema is stored verbatim, and one such
    number made the session's append fail and the session end. Encoding the
    event as the log would is the check (C speed, under a microsecond); only
    a refusal decodes the frame again to name the field."""
    try:
        _log_encoder.encode(event)
    except OverflowError:
        try:
            raw = msgspec.json.decode(data)
        except msgspec.DecodeError:
            # The typed decoder skips unknown keys unread (invalid UTF-8 and all);
            # this one refuses them: the field goes unnamed.
            raw = None
        path = _out_of_range(raw)
        where = f" at {path}" if path else ""
        raise ProtocolError(
            "invalid_event",
            f"an integer{where} is outside the range served ({MIN_INT} to {MAX_INT})",
            param=path or None,
            event_id=_event_id_of(raw),
        ) from None


def _out_of_range(value: Any) -> str | None:
    """The dotted path of the first integer outside [MIN_INT, MAX_INT], without recursion."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, bool):
            continue
        if isinstance(node, int):
            if not MIN_INT <= node <= MAX_INT:
                return path
        elif isinstance(node, dict):
            stack.extend((child, f"{path}.{key}" if path else key) for key, child in node.items())
        elif isinstance(node, list):
            stack.extend((child, f"{path}.{i}" if path else str(i)) for i, child in enumerate(node))
    return None


def _depth(value: Any) -> int:
    """Nesting depth of decoded JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node)
    return deepest


class FrameDecoder:
    """Decodes client text frames; stateless apart from its limits."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._typed = msgspec.json.Decoder(AnyClientEvent)

    def decode(self, frame: str | bytes) -> AnyClientEvent:
        data = frame.encode() if isinstance(frame, str) else frame
        if len(data) > self.max_frame_bytes:
            raise ProtocolError(
                "payload_too_large",
                f"frame of {len(data)} bytes exceeds the limit of {self.max_frame_bytes} bytes",
            )
        check_nesting(data)
        try:
            event = self._typed.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            event = self._decode_slowly(data)
        if not isinstance(event, InputAudioAppend):  # the hot path: typed fields only
            check_integers(event, data)
        # Media payloads stay base64 here: the session decodes them exactly once,
        # with the same invalid_audio error this gate would give.
        return event

    def _decode_slowly(self, frame: str | bytes) -> AnyClientEvent:
        """Slow path: a frame with nulls for optional fields decodes without
        them; anything else raises a ProtocolError saying exactly why."""
        try:
            raw = msgspec.json.decode(frame)
        except msgspec.DecodeError as exc:
            raise ProtocolError("invalid_json", f"frame is not valid JSON: {exc}") from None
        event_id = _event_id_of(raw)
        if not isinstance(raw, dict):
            raise ProtocolError("invalid_event", "frame must be a JSON object", param="type")
        event_type = raw.get("type")
        if not isinstance(event_type, str):
            raise ProtocolError(
                "invalid_event", "missing string field 'type'", param="type", event_id=event_id
            )
        cls = CLIENT_EVENT_TYPES.get(event_type)
        if cls is None:
            raise ProtocolError(
                "unknown_event_type",
                f"unknown event type {event_type!r}",
                param="type",
                event_id=event_id,
            )
        try:
            # cls is one member of the AnyClientEvent union (CLIENT_EVENT_TYPES)
            event = cast(AnyClientEvent, msgspec.convert(drop_optional_nulls(raw, cls), cls))
        except msgspec.ValidationError as exc:
            message = str(exc)
            raise ProtocolError(
                "invalid_event",
                f"{event_type}: {message}",
                param=_param_from(message),
                event_id=event_id,
            ) from None
        return event


def drop_optional_nulls(raw: Any, cls: type[msgspec.Struct]) -> Any:
    """``raw`` without the ``null``s sent for optional fields that take no null.

    OpenAI's clients send ``null`` for "not given" (``"instructions": null``);
    our structs spell that as absent. Where ``null`` means something of its own
    (``turn_detection: null``) the field's type takes ``None`` and it stays.
    Only the schema's own depth is walked, never the input's."""
    return _strip(raw, _struct_info(cls))


@functools.cache
def _struct_info(cls: type[msgspec.Struct]) -> mi.StructType:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return info


def _strip(raw: Any, info: mi.StructType) -> Any:
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    for field in info.fields:
        if field.encode_name not in out:
            continue
        value = out[field.encode_name]
        if value is None and not field.required and not _takes_none(field.type):
            del out[field.encode_name]
        elif value is not None:
            out[field.encode_name] = _strip_typed(value, field.type)
    return out


def _strip_typed(value: Any, kind: mi.Type) -> Any:
    # msgspec allows one untagged Struct per union, so the first that fits is it.
    members = kind.types if isinstance(kind, mi.UnionType) else (kind,)
    for member in members:
        if isinstance(member, mi.StructType) and isinstance(value, dict):
            return _strip(value, member)
        if isinstance(member, mi.ListType) and isinstance(value, list):
            return [_strip_typed(item, member.item_type) for item in value]
    return value


def _takes_none(kind: mi.Type) -> bool:
    members = kind.types if isinstance(kind, mi.UnionType) else (kind,)
    return any(isinstance(member, mi.NoneType) for member in members)


_encoder = msgspec.json.Encoder()


def encode_server_event(event: ServerEvent) -> bytes:
    return _encoder.encode(event)


_server_decoder = msgspec.json.Decoder(AnyServerEvent)


def decode_server_event(frame: str | bytes) -> AnyServerEvent:
    return _server_decoder.decode(frame)
