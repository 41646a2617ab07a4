"""``duplex-server bench fuzz``: generated client frames against one real server.

Frames are built from the protocol's own Structs (``msgspec.inspect`` walks
``CLIENT_EVENT_TYPES``, so a field added tomorrow is fuzzed tomorrow): mostly
valid values, so sessions reach deep states, mixed with boundary and invalid
ones (wrong types, nulls, unknown keys, deep nesting, unicode, huge numbers)
and frames that are not JSON at all. Every choice comes from a
:class:`Source`: here a seeded ``random.Random``; in ``tests/test_fuzz.py``
hypothesis, so a failing sequence shrinks.

Against the server each socket sends a batch of frames, then a heartbeat
and a marker frame (an unknown type with its own ``event_id``, refused in
order behind the batch). The marker's error says the batch was handled;
the heartbeat's ack says the session still answers. Every error must carry
a documented code, every frame the local decoder refuses must get that
code back, and when a session ends its log must hold contiguous record
seqs, one record for each event the socket received (none lost, none
twice), and fold to what the live session showed. The server's stderr is
read for tracebacks and ERROR records: any one fails the run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import math
import random
import re
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import msgspec
import msgspec.inspect as mi
import numpy as np
import websockets

from duplex_bench.generator import GeneratorCpu, validity
from duplex_bench.server_process import ServerProcess
from duplex_server.surface import (
    OutBody,
    Record,
    RecordLine,
    build_model,
    fold,
    initial_state,
    session_object,
)
from protocol.capabilities import Capabilities
from protocol.client_events import CLIENT_EVENT_TYPES, SessionClose
from protocol.codec import DEFAULT_MAX_FRAME_BYTES, FrameDecoder
from protocol.errors import ERROR_CLASS, ProtocolError

# --- where choices come from ---------------------------------------------------


class Source(Protocol):
    """Every choice the generator makes; hypothesis implements it in the tests."""

    def below(self, n: int) -> int:
        """An int in ``[0, n)``; 0 is the simplest choice (what shrinking aims for)."""
        ...

    def integer(self, lo: int, hi: int) -> int: ...

    def real(self) -> float:
        """Any float, specials included (NaN and infinities are not JSON)."""
        ...

    def text(self, max_size: int) -> str:
        """Any unicode, lone surrogates and control characters included."""
        ...


_CHARS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.:/",
    "\"\\'{}[],:\n\t\r\x00\x01\x1f\x7f",
    "éßøΩЖ中文日本語한국어עבריתالعربية",
    "\u200b\u200d\u202e\ufeff\ufffd\uffff\u0301",
    "😀🎙👩\u200d👩\u200d👧𝄞\U0010ffff",
    "\ud800\udbff\udc00\udfff",  # lone surrogates: not UTF-8 at all
)
_SPECIAL_FLOATS = (0.0, -0.0, 5e-324, 1e-300, 1.7976931348623157e308, -1e308, 0.5, 1e16)
_NOT_FINITE = (math.nan, math.inf, -math.inf)


class RandomSource:
    """The bench's source: a seeded ``random.Random``."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def below(self, n: int) -> int:
        return self.rng.randrange(n)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def real(self) -> float:
        pick = self.rng.randrange(20)
        if pick == 0:
            return self.rng.choice(_NOT_FINITE)
        if pick < 5:
            return self.rng.choice(_SPECIAL_FLOATS)
        if pick < 8:
            return math.ldexp(self.rng.random(), self.rng.randint(-1074, 1023)) * self.rng.choice(
                (1, -1)
            )
        return round(self.rng.uniform(-10.0, 5000.0), self.rng.randrange(4))

    def text(self, max_size: int) -> str:
        size = self.rng.choice((0, 1, 3, 8, max_size))
        pools = _CHARS[: 1 + self.rng.randrange(len(_CHARS))]
        return "".join(self.rng.choice(self.rng.choice(pools)) for _ in range(size))


# --- what the generator knows of the session ----------------------------------

_KEEP = 16  # recent ids of each kind worth aiming at


@dataclass
class Known:
    """What the server said so far: ids and counters worth aiming frames at,
    so references hit (as well as miss) real items and responses."""

    item_ids: list[str] = field(default_factory=list)
    response_ids: list[str] = field(default_factory=list)
    session_ids: list[str] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)
    max_seq: int = 0
    epoch: int = 0

    def learn(self, event: dict[str, Any]) -> None:
        seq = event.get("server_event_seq")
        if isinstance(seq, int):
            self.max_seq = max(self.max_seq, seq)
        for holder in (event, event.get("event")):
            if isinstance(holder, dict) and isinstance(holder.get("epoch"), int):
                self.epoch = max(self.epoch, holder["epoch"])
        for key in ("item_id", "previous_item_id"):
            _remember(self.item_ids, event.get(key))
        _remember(self.response_ids, event.get("response_id"))
        for key, ids in (("item", self.item_ids), ("response", self.response_ids)):
            nested = event.get(key)
            if isinstance(nested, dict):
                _remember(ids, nested.get("id"))
        session = event.get("session")
        if event.get("type") == "session.created" and isinstance(session, dict):
            _remember(self.session_ids, session.get("id"))


def _remember(ids: list[str], value: object) -> None:
    if isinstance(value, str) and value and value not in ids:
        ids.append(value)
        del ids[:-_KEEP]


# --- frames ----------------------------------------------------------------------

_FORMATS = (
    "pcm16",
    "pcm_s16le",
    "audio/pcm",
    "pcm_f32le",
    "g711_ulaw",
    "audio/pcmu",
    "g711_alaw",
    "pcma",
    "opus",
    "audio/opus",
    "PCM16",
    "wav",
    "mp3",
    "",
)
_RATES = (24_000, 16_000, 8_000, 48_000, 44_100, 7_999, 48_001)
_VOICES = ("alloy", "echo", "verse", "marin", "")
_PART_TYPES = ("input_text", "input_audio", "text", "audio", "output_text", "output_audio", "x")
_TURN_TYPES = ("server_vad", "semantic_vad", "none", "push_to_talk")
# Frames that nest deeper than the decoder allows (64), at and around the limit.
_DEPTHS = (63, 64, 65, 66, 100, 975, 5_000, 100_000)
_HUGE_INTS = (
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63) - 1,
    10**30,
    10**400,
)


def _event_classes() -> list[mi.StructType]:
    """Every client event's type info, session.close last."""
    infos = [mi.type_info(cls) for cls in CLIENT_EVENT_TYPES.values()]
    structs = [info for info in infos if isinstance(info, mi.StructType)]
    return sorted(structs, key=lambda info: info.cls is SessionClose)


_EVENTS = _event_classes()


def encode_frame(obj: object, ascii_only: bool = False) -> str | bytes:
    """JSON text as a client would send it; a string holding lone surrogates
    cannot be UTF-8, so it goes as the (invalid) bytes of a binary frame."""
    text = json.dumps(obj, ensure_ascii=ascii_only)  # NaN and Infinity stay: not JSON
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")
    return text


class FrameFuzzer:
    """Client frames from the protocol's Structs; each call of :meth:`frame` is one."""

    def __init__(
        self,
        source: Source,
        known: Known | None = None,
        *,
        oversize: bool = False,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.s = source
        self.known = known if known is not None else Known()
        self.oversize = oversize
        self.max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._vocabulary = self._build_vocabulary()

    # -- choices --

    def pick(self, options: tuple | list) -> Any:
        return options[self.s.below(len(options))]

    def chance(self, percent: int) -> bool:
        """True ``percent`` times in 100; the simplest draw (0) is False."""
        return self.s.below(100) >= 100 - percent

    # -- frames --

    def frame(self) -> str | bytes:
        if self.oversize and self.s.below(2_000) == 1_999:
            return self._oversize_frame()  # 4 MiB each: rare
        modes: list[tuple[int, Callable[[], str | bytes]]] = [
            (70, self._event_frame),
            (6, self._corrupt_frame),
            (5, self._type_fault_frame),
            (4, self._json_value_frame),
            (4, self._deep_frame),
            (3, self._binary_frame),
            (1, self._empty_frame),
        ]
        roll = self.s.below(sum(weight for weight, _ in modes))
        for weight, make in modes:
            if roll < weight:
                return make()
            roll -= weight
        raise AssertionError("unreachable")

    def event(self, fault: int = 0) -> dict[str, Any]:
        """One client event as a dict; ``fault`` is the percent chance that
        each value is a boundary or an invalid one instead of a valid one."""
        # session.close ends the session: rarely, so sessions get somewhere first
        info = _EVENTS[-1] if self.s.below(500) == 499 else self.pick(_EVENTS[:-1])
        return self._struct(info, fault)

    def _fault_level(self) -> int:
        return self.pick((0, 0, 5, 30))

    def _event_frame(self) -> str | bytes:
        return encode_frame(self.event(self._fault_level()), ascii_only=self.chance(30))

    def _binary_frame(self) -> str | bytes:
        frame = encode_frame(self.event(self._fault_level()))
        return frame.encode() if isinstance(frame, str) else frame

    def _empty_frame(self) -> str | bytes:
        return self.pick(("", b"", " \n", "null"))

    def _type_fault_frame(self) -> str | bytes:
        event = self.event(self._fault_level())
        tag = event.pop("type")
        kind = self.s.below(6)
        if kind == 1:
            event["type"] = tag.upper()
        elif kind == 2:
            event["type"] = f" {tag}"
        elif kind == 3:
            event["type"] = self.s.text(24)
        elif kind == 4:
            event["type"] = self._json_value(1, exclude=str)
        elif kind == 5:
            event["type"] = None
        return encode_frame(event)

    def _json_value_frame(self) -> str | bytes:
        return encode_frame(self._json_value(3, exclude=dict))

    def _deep_frame(self) -> str | bytes:
        depth = self.pick(_DEPTHS)
        opener, closer = self.pick((("[", "]"), ('{"a":', "}"), ('[{"b":', "}]")))
        if opener.startswith("[{"):
            depth //= 2
        inner = opener * depth + "0" + closer * depth
        if self.chance(20):
            inner = opener * depth  # never closed: not JSON either
        envelope = self.pick(
            (
                "{}",
                '{"type":"session.update","session":{"tools":[{"parameters":{"x":{}}}]}}',
                '{"type":"response.create","response":{"input":[{"x":{}}]}}',
                '{"type":"input.text.append","event_id":{}}',
            )
        )
        # the outer braces of the envelope are JSON's, so no str.format here
        at = envelope.index("{}", 1) if envelope != "{}" else 0
        return envelope[:at] + inner + envelope[at + 2 :]

    def _oversize_frame(self) -> str | bytes:
        envelope = '{"type":"input.text.append","text":""}'
        size = self.max_frame_bytes + self.pick((1, 0, -1))
        return envelope[:-2] + "x" * (size - len(envelope)) + envelope[-2:]

    def _corrupt_frame(self) -> str | bytes:
        frame = encode_frame(self.event(self._fault_level()))
        data = bytearray(frame.encode() if isinstance(frame, str) else frame)
        kind = self.s.below(9)
        at = self.s.below(len(data) + 1)
        if kind == 0:
            del data[at:]
        elif kind == 1:
            data[at:at] = bytes([self.s.below(256)])
        elif kind == 2 and at < len(data):
            del data[at]
        elif kind == 3:
            data[at:at] = self.pick((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"))
        elif kind == 4:
            data += self.pick((b"x", b"}", b" {}", b"\n" + bytes(data)))
        elif kind == 5:
            data[:0] = b"\xef\xbb\xbf"  # a byte-order mark
        else:
            number = re.search(rb"(?<![\w.])-?\d+(\.\d+)?([eE][-+]?\d+)?", bytes(data))
            literal = self.pick((b"NaN", b"Infinity", b"-Infinity", b"1e400", b"9" * 400, b"-0"))
            if number is None:
                data[at:at] = literal
            else:
                data[number.start() : number.end()] = literal
        try:
            return data.decode()
        except UnicodeDecodeError:
            return bytes(data)

    # -- values from type info --

    def _struct(self, info: mi.StructType, fault: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if info.tag_field is not None:
            out[info.tag_field] = info.tag
        owner = info.cls.__name__
        for spec in info.fields:
            if not spec.required and not self.chance(50):
                continue
            out[spec.encode_name] = self._field(spec.type, spec.name, owner, fault)
        if fault and self.chance(fault):
            out[self.pick(("x_unknown", "Type", "", self.s.text(12)))] = self._json_value(2)
        return out

    def _field(self, kind: mi.Type, name: str, owner: str, fault: int) -> Any:
        if fault and self.chance(fault):
            return self._fault(kind)
        return self._valid(kind, name, owner, fault)

    def _valid(self, kind: mi.Type, name: str, owner: str, fault: int) -> Any:
        if isinstance(kind, mi.UnionType):
            members = sorted(kind.types, key=lambda member: isinstance(member, mi.NoneType))
            kind = self.pick(members)
        make = self._vocabulary.get((owner, name)) or self._vocabulary.get(name)
        if make is not None and self._vocabulary_fits(kind) and not self.chance(15):
            return make()
        if isinstance(kind, mi.StructType):
            return self._struct(kind, fault)
        if isinstance(kind, mi.ListType):
            return [self._field(kind.item_type, name, owner, fault) for _ in range(self.s.below(4))]
        if isinstance(kind, mi.DictType):
            return {
                self.s.text(8): self._field(kind.value_type, name, owner, fault)
                for _ in range(self.s.below(3))
            }
        if isinstance(kind, mi.LiteralType):
            return self.pick(kind.values)
        if isinstance(kind, mi.BoolType):
            return self.chance(50)
        if isinstance(kind, mi.NoneType):
            return None
        if isinstance(kind, mi.IntType):
            lo, hi = _int_bounds(kind)
            return self.s.integer(lo, min(hi, lo + self.pick((3, 100, 100_000))))
        if isinstance(kind, mi.FloatType):
            lo_f, hi_f = _float_bounds(kind)
            return round(
                self.s.integer(0, 1000) / 1000 * (min(hi_f, lo_f + 5000.0) - lo_f) + lo_f, 3
            )
        if isinstance(kind, mi.StrType):
            return self.s.text(24)
        return self._json_value(2)  # Any, object: anything JSON

    @staticmethod
    def _vocabulary_fits(kind: mi.Type) -> bool:
        return isinstance(kind, mi.StrType | mi.IntType | mi.FloatType | mi.ListType)

    def _fault(self, kind: mi.Type) -> Any:
        roll = self.s.below(5)
        if roll == 0:
            return None
        if roll == 1:
            return self._boundary(kind)
        if roll == 2:
            return self._json_value(2)  # most likely the wrong type
        if roll == 3:
            depth = self.pick((2, 10, 62, 63, 64, 65, 100))
            value: Any = self._json_value(0)
            for _ in range(depth):
                value = [value] if self.chance(50) else {"k": value}
            return value
        return self.pick(_HUGE_INTS)

    def _boundary(self, kind: mi.Type) -> Any:
        members = kind.types if isinstance(kind, mi.UnionType) else (kind,)
        kind = members[0]
        if isinstance(kind, mi.IntType):
            lo, hi = _int_bounds(kind)
            edges = [lo - 1, lo, 0, -1, *_HUGE_INTS[:8]]
            if hi < 2**63:
                edges += [hi, hi + 1]
            return self.pick(edges)
        if isinstance(kind, mi.FloatType):
            lo_f, hi_f = _float_bounds(kind)
            edges_f = [lo_f, math.nextafter(lo_f, -math.inf), self.s.real(), 1e308, -1e308]
            if hi_f < math.inf:
                edges_f += [hi_f, math.nextafter(hi_f, math.inf)]
            return self.pick(edges_f)
        if isinstance(kind, mi.StrType):
            return self.pick(("", " ", "\x00", "a" * 10_000, self.s.text(64)))
        if isinstance(kind, mi.ListType):
            return self.pick(([], [None], [self._json_value(0)] * 1000))
        return self._json_value(1)

    def _json_value(self, depth: int, exclude: type | None = None) -> Any:
        while True:
            roll = self.s.below(8 if depth > 0 else 6)
            value: Any
            if roll == 0:
                value = None
            elif roll == 1:
                value = self.chance(50)
            elif roll == 2:
                value = self.pick((0, -1, 1, *_HUGE_INTS))
            elif roll == 3:
                value = self.s.real()
            elif roll in (4, 5):
                value = self.s.text(16)
            elif roll == 6:
                value = [self._json_value(depth - 1) for _ in range(self.s.below(3))]
            else:
                value = {
                    self.s.text(6): self._json_value(depth - 1) for _ in range(self.s.below(3))
                }
            if exclude is None or not isinstance(value, exclude):
                return value

    # -- values that mean something to the server --

    def _build_vocabulary(self) -> dict[Any, Callable[[], Any]]:
        item_id = lambda: self._known_or_new(self.known.item_ids, "item_")  # noqa: E731
        rate = lambda: self.pick(_RATES)  # noqa: E731
        fmt = lambda: self.pick(_FORMATS)  # noqa: E731
        ms = lambda: self.pick((0.0, 20.0, 100.0, 1500.5, 60_000.0))  # noqa: E731
        return {
            "event_id": self._event_id,
            "epoch": lambda: max(0, self.known.epoch + self.pick((0, 1, -1))),
            "audio": self._audio,
            ("ContentPart", "audio"): self._audio,
            "video_frames": lambda: [self._video_frame() for _ in range(self.s.below(3))],
            "format": fmt,
            "input_audio_format": fmt,
            "output_audio_format": fmt,
            ("AudioFormatObject", "type"): fmt,
            ("AudioFormatObject", "rate"): rate,
            "sample_rate_hz": rate,
            "input_sample_rate_hz": rate,
            "output_sample_rate_hz": rate,
            "voice": lambda: self.pick(_VOICES),
            "model": lambda: self.pick(("echo", "gpt-realtime")),
            ("SessionUpdate", "type"): lambda: self.pick(("realtime", "transcription")),
            ("ContentPart", "type"): lambda: self.pick(_PART_TYPES),
            ("TurnDetection", "type"): lambda: self.pick(_TURN_TYPES),
            ("Tool", "type"): lambda: "function",
            "item_id": item_id,
            "previous_item_id": lambda: self.pick(("root", item_id())),
            ("ConversationItem", "id"): lambda: self.pick((None, item_id(), f"item_f{self._n()}")),
            "response_id": lambda: self._known_or_new(self.known.response_ids, "resp_"),
            "session_id": lambda: self._known_or_new(self.known.session_ids, "sess_"),
            "server_event_seq": lambda: self.s.integer(0, self.known.max_seq + 2),
            "last_received_server_event_seq": lambda: self.s.integer(0, self.known.max_seq + 2),
            "content_index": lambda: self.pick((0, 1)),
            "audio_end_ms": ms,
            "played_ms": ms,
            "committed_ms": ms,
            "duration_ms": ms,
            "arguments": lambda: self.pick(("{}", '{"a": 1}', "not json")),
            "conversation": lambda: self.pick(("auto", "none")),
            "tool_choice": lambda: self.pick(("auto", "none", "required")),
            "chunk_delay_ms": lambda: self.pick((0.0, 1.0, 20.0)),
            "idle_timeout_s": lambda: self.pick((60.0, 3600.0, 1e9)),
            "force_listen_count": lambda: self.pick((0, 1, 3)),
            "prefix_padding_ms": lambda: self.pick((0, 300)),
            "silence_duration_ms": lambda: self.pick((100, 500)),
        }

    def _n(self) -> int:
        return next(self._ids)

    def _known_or_new(self, ids: list[str], prefix: str) -> str:
        if ids and not self.chance(20):
            return self.pick(ids)
        return f"{prefix}{self.s.text(10)}"

    def _event_id(self) -> str:
        recent = self.known.event_ids
        if recent and self.chance(15):
            return self.pick(recent)  # a retry: applied once only
        event_id = self.pick((f"evt_{self._n()}", self.s.text(12)))
        _remember(recent, event_id)
        return event_id

    def _audio(self) -> str:
        size = self.pick((960, 4800, 0, 2, 1, 3200, 9600))
        shape = self.s.below(5)
        if shape == 0:
            t = np.arange(size // 2) / 24_000
            pcm = (np.sin(2 * np.pi * 220.0 * t) * 12_000).astype("<i2").tobytes()
        elif shape == 1:
            pcm = random.Random(self.s.integer(0, 2**32)).randbytes(size)
        elif shape == 2:
            pcm = bytes(size)
        elif shape == 3:
            return self.pick(("!!!!", "abc", "QUJD\n", "QQ==QQ==", "data:audio/wav;base64,AAAA"))
        else:
            return base64.b64encode(bytes(size)).decode().rstrip("=")
        return base64.b64encode(pcm).decode()

    def _video_frame(self) -> str:
        jpeg = b"\xff\xd8\xff\xe0" + bytes(self.pick((0, 16, 300)))
        encoded = base64.b64encode(jpeg).decode()
        return self.pick((encoded, "data:image/jpeg;base64," + encoded, "%%%", ""))


def _int_bounds(kind: mi.IntType) -> tuple[int, int]:
    lo = kind.ge if kind.ge is not None else (kind.gt + 1 if kind.gt is not None else -1000)
    hi = kind.le if kind.le is not None else (kind.lt - 1 if kind.lt is not None else 2**63)
    return lo, hi


def _float_bounds(kind: mi.FloatType) -> tuple[float, float]:
    lo = kind.ge if kind.ge is not None else (kind.gt if kind.gt is not None else -1000.0)
    hi = kind.le if kind.le is not None else (kind.lt if kind.lt is not None else math.inf)
    if kind.gt is not None:
        lo = math.nextafter(lo, math.inf)
    return float(lo), float(hi)


# --- against a server ----------------------------------------------------------------

ANSWER_TIMEOUT_S = 30.0  # a batch unanswered this long is a stall, not a slow answer
PROBE_PREFIX = "fz-"  # event ids of the client's own probes, never generated
PROBES = 5  # heartbeats a batch may take when the journal's window overflows
ENDING_EVENTS = ("session.closed", "session.expired", "session.replaced")


@dataclass
class Tally:
    """What the fuzzing clients saw; :attr:`faults` lists every broken promise."""

    frames: int = 0
    batches: int = 0
    sessions: int = 0
    errors_by_code: Counter[str] = field(default_factory=Counter)
    events_by_type: Counter[str] = field(default_factory=Counter)
    ended_by: Counter[str] = field(default_factory=Counter)
    heartbeat_failures: int = 0
    faults: list[str] = field(default_factory=list)
    # the frames of the batch that broke each promise (the first few), to reproduce it
    reproducers: list[list[str]] = field(default_factory=list)

    def fault(self, message: str, frames: list[str | bytes] | None = None) -> None:
        self.faults.append(message)
        if frames is not None and len(self.reproducers) < 5:
            self.reproducers.append([repr(frame)[:400] for frame in frames])


def predicted_code(decoder: FrameDecoder, frame: str | bytes) -> str | None:
    """The error code the server's own decoder gives ``frame``, None if it
    decodes; any other exception is the decoder's bug (the server's too) and
    is raised as :class:`DecoderNotTotal`."""
    try:
        decoder.decode(frame)
    except ProtocolError as err:
        return err.code
    except Exception as exc:
        raise DecoderNotTotal(f"{type(exc).__name__}: {exc}") from exc
    return None


class DecoderNotTotal(Exception):
    """``FrameDecoder.decode`` raised something other than a coded ProtocolError."""


class SocketReader:
    """Everything one socket receives, checked as it arrives."""

    def __init__(self, ws: websockets.ClientConnection, known: Known, tally: Tally) -> None:
        self.ws = ws
        self.known = known
        self.tally = tally
        self.events: list[dict[str, Any]] = []
        self.seqs: list[int] = []
        self.ended: str | None = None
        self.stalled = False  # a batch went unanswered with the socket open
        self.closed = asyncio.Event()
        self.arrived = asyncio.Event()
        self.close_code: int | None = None

    @property
    def live(self) -> bool:
        """Still worth sending to: not ended, closed or stalled."""
        return self.ended is None and not self.closed.is_set() and not self.stalled

    async def run(self) -> None:
        try:
            async for frame in self.ws:
                try:
                    event = json.loads(frame)
                except ValueError:
                    self.tally.fault(f"the server sent a frame that is not JSON: {frame!r:.200}")
                    continue
                self._take(event)
        except websockets.ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            self.closed.set()
            self.arrived.set()

    def _take(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self.known.learn(event)
        seq = event.get("server_event_seq")
        if isinstance(seq, int):
            self.seqs.append(seq)
        kind = event.get("type")
        self.tally.events_by_type[str(kind)] += 1
        if kind == "error":
            body = event.get("error") or {}
            code = str(body.get("code"))
            if not str(body.get("event_id")).startswith(PROBE_PREFIX):
                self.tally.errors_by_code[code] += 1  # the fuzzed frames', not the probes'
            if code not in ERROR_CLASS or body.get("type") != ERROR_CLASS[code]:
                self.tally.fault(f"error without a documented code: {json.dumps(event)[:300]}")
        elif kind in ENDING_EVENTS:
            self.ended = f"{kind}:{event.get('reason')}"
        self.arrived.set()

    async def wait_for(self, found: Callable[[], bool]) -> bool:
        """Until ``found()`` or the socket closes; False on a stall."""
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not found():
            if self.closed.is_set():
                return found()
            self.arrived.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self.arrived.wait(), left)
            except TimeoutError:
                return found()
        return True


class FuzzClient:
    """Opens sessions on one server and fuzzes them, one socket at a time."""

    def __init__(self, ws_url: str, http_url: str, tally: Tally, model: str = "echo") -> None:
        self.ws_url = ws_url
        self.http_url = http_url
        self.tally = tally
        # the fold starts where the server's sessions start: its model's name and turn types
        served = build_model(model)
        self.model, self.turn_detection_types = served.name, served.turn_detection_types
        self.decoder = FrameDecoder()
        self._probes = itertools.count(1)

    async def session(self, fuzzer: FrameFuzzer, frames: int, batch: int) -> int:
        """One session: ``frames`` generated frames (fewer if the session is
        ended by one of them) in batches of ``batch``; returns how many were sent."""
        async with websockets.connect(self.ws_url, max_size=None, ping_interval=None) as ws:
            reader = SocketReader(ws, fuzzer.known, self.tally)
            reading = asyncio.get_running_loop().create_task(reader.run())
            try:
                return await self._fuzz(ws, reader, fuzzer, frames, batch)
            finally:
                reading.cancel()

    async def _fuzz(
        self,
        ws: websockets.ClientConnection,
        reader: SocketReader,
        fuzzer: FrameFuzzer,
        frames: int,
        batch: int,
    ) -> int:
        tally = self.tally
        await reader.wait_for(lambda: bool(reader.events))
        created = reader.events[0] if reader.events else {}
        if created.get("type") != "session.created":
            tally.fault(f"the socket opened with {json.dumps(created)[:200]}, not session.created")
            return 0
        session_id = str(created["session"]["id"])
        tally.sessions += 1
        sent = 0
        while reader.live and sent < frames:
            chunk = [fuzzer.frame() for _ in range(min(batch, frames - sent))]
            sent += await self._batch(ws, reader, chunk)
        if reader.stalled:
            return sent  # not answering: nothing more to ask of it
        if reader.live:
            await self._check_refold(session_id)
            await self._send(
                ws, json.dumps({"type": "session.close", "event_id": f"{PROBE_PREFIX}close"})
            )
            await reader.wait_for(lambda: reader.ended is not None)
        await reader.wait_for(reader.closed.is_set)
        if reader.ended is None:
            tally.fault(f"socket of {session_id} closed ({reader.close_code}) without a reason")
        else:
            tally.ended_by[reader.ended] += 1
        await self._check_log(session_id, reader)
        return sent

    async def _send(self, ws: websockets.ClientConnection, frame: str | bytes) -> bool:
        try:
            await ws.send(frame)
        except websockets.ConnectionClosed:
            return False
        return True

    async def _batch(
        self, ws: websockets.ClientConnection, reader: SocketReader, chunk: list[str | bytes]
    ) -> int:
        """Send ``chunk`` and check what came back; returns how many frames went out."""
        tally = self.tally
        start = len(reader.events)
        expected: Counter[str] = Counter()
        sent = 0
        for frame in chunk:
            if reader.ended is not None or not await self._send(ws, frame):
                break
            sent += 1
            try:
                code = predicted_code(self.decoder, frame)
            except DecoderNotTotal as exc:
                tally.fault(f"the frame decoder raised {exc}", [frame])
                continue
            if code is not None:
                expected[code] += 1
        tally.frames += sent
        tally.batches += 1
        answered = await self._probe(ws, reader)
        if answered is None:
            reader.stalled = not reader.closed.is_set()
            tally.heartbeat_failures += 1
            state = "closed" if reader.closed.is_set() else "stalled"
            tally.fault(f"batch {tally.batches}: no answer, socket {state}", chunk)
            return sent
        if reader.ended is not None:
            return sent  # a frame ended the session (session.close, a tiny idle_timeout_s)
        if not answered:
            tally.heartbeat_failures += 1
            tally.fault(f"batch {tally.batches}: heartbeat not answered", chunk)
        window = reader.events[start:]
        got = Counter(
            (event.get("error") or {}).get("code") for event in window if event["type"] == "error"
        )
        short = sum(max(0, n - got[code]) for code, n in expected.items())
        # an ack of events not yet received drops them: the socket is told so
        resynced = any(event.get("type") == "session.resync_required" for event in window)
        if short > got["rate_limited"] and not resynced:
            tally.fault(f"batch {tally.batches}: {short} refused frames got no error", chunk)
        return sent

    async def _probe(self, ws: websockets.ClientConnection, reader: SocketReader) -> bool | None:
        """A heartbeat, then a marker frame refused in order behind it: True
        once the marker's error is back with the heartbeat acked before it,
        None if nothing came back. Events can outgrow the journal's window
        (a 4 MiB text echoed back), and the socket then gets
        ``session.resync_required`` in place of what fell out, the ack
        perhaps among them: then it asks again."""
        for _ in range(PROBES):
            answer = await self._probe_once(ws, reader)
            if answer != "resynced":
                return answer
        return False

    async def _probe_once(
        self, ws: websockets.ClientConnection, reader: SocketReader
    ) -> bool | None | Literal["resynced"]:
        probe = next(self._probes)
        heartbeat, marker = f"{PROBE_PREFIX}hb-{probe}", f"{PROBE_PREFIX}mark-{probe}"
        since = len(reader.events)
        await self._send(ws, json.dumps({"type": "session.heartbeat", "event_id": heartbeat}))
        await self._send(ws, json.dumps({"type": "fuzz.marker", "event_id": marker}))

        def marked() -> bool:
            return any(_error_for(event, marker) for event in reader.events[since:])

        def resynced() -> bool:
            return any(
                event.get("type") == "session.resync_required" for event in reader.events[since:]
            )

        if not await reader.wait_for(lambda: reader.ended is not None or marked() or resynced()):
            return None
        if reader.ended is not None:
            return True
        if not marked():
            return "resynced"
        window = reader.events[since:]
        acked = any(event.get("type") == "session.heartbeat_ack" for event in window)
        return acked and not any(_error_for(event, heartbeat) for event in window)

    async def _check_refold(self, session_id: str) -> None:
        """The live session equals the fold of (a prefix of) the log it wrote:
        the snapshot is read first, so later records may follow it."""
        live = await _get_json(f"{self.http_url}/v1/sessions/{session_id}")
        records = await read_log(self.http_url, session_id)
        if not isinstance(live, dict) or not records:
            self.tally.fault(f"{session_id}: no snapshot or no log to compare")
            return
        capabilities = msgspec.convert(live["capabilities"], Capabilities)
        state = initial_state(session_id, self.model, self.turn_detection_types)
        fold(records, state)

        def snapshot() -> Any:
            return msgspec.json.decode(msgspec.json.encode(session_object(state, capabilities)))

        if snapshot() == live:
            return
        state = initial_state(session_id, self.model, self.turn_detection_types)
        for record in records:
            fold([record], state)
            if snapshot() == live:
                return
        self.tally.fault(f"{session_id}: refold of the log differs from the live session")

    async def _check_log(self, session_id: str, reader: SocketReader) -> None:
        records = await read_log(self.http_url, session_id)
        seqs = [record.seq for record in records]
        if seqs != list(range(1, len(seqs) + 1)):
            self.tally.fault(f"{session_id}: record seqs not contiguous from 1")
        logged = [
            record.body.server_event_seq for record in records if isinstance(record.body, OutBody)
        ]
        if logged != list(range(1, len(logged) + 1)):
            self.tally.fault(f"{session_id}: server_event_seqs in the log not contiguous")
        if len(reader.seqs) != len(set(reader.seqs)):
            self.tally.fault(f"{session_id}: an event was received twice")
        resynced = any(event.get("type") == "session.resync_required" for event in reader.events)
        if not resynced and sorted(reader.seqs) != logged:
            missing = sorted(set(logged) - set(reader.seqs))[:5]
            extra = sorted(set(reader.seqs) - set(logged))[:5]
            self.tally.fault(f"{session_id}: events not received {missing}, not logged {extra}")


def _error_for(event: dict[str, Any], event_id: str) -> bool:
    return event.get("type") == "error" and (event.get("error") or {}).get("event_id") == event_id


async def _get_json(url: str) -> Any:
    def get() -> Any:
        with urllib.request.urlopen(url, timeout=ANSWER_TIMEOUT_S) as response:
            return json.loads(response.read())

    return await asyncio.to_thread(get)


async def read_log(http_url: str, session_id: str) -> list[Record]:
    """A session's records, read back through ``GET /v1/sessions/{id}/events``."""

    def get() -> list[Record]:
        url = f"{http_url}/v1/sessions/{session_id}/events"
        with urllib.request.urlopen(url, timeout=ANSWER_TIMEOUT_S) as response:
            lines = [
                msgspec.json.decode(line, type=RecordLine) for line in response if line.strip()
            ]
        return [
            Record(
                epoch=line.epoch,
                ts_ms=line.ts_ms,
                origin=line.origin,  # type: ignore[arg-type]  # written from a Record's origin
                body=line.body,
                event_id=line.event_id,
                seq=line.seq,
            )
            for line in lines
        ]

    return await asyncio.to_thread(get)


# --- the server's own account ------------------------------------------------------

_LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):")


class ServerLog:
    """A server's stderr, and what in it counts as a server exception:
    ERROR and CRITICAL records and any traceback."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def exceptions(self) -> list[list[str]]:
        """Each ERROR/CRITICAL record or traceback, with the lines under it."""
        entries: list[list[str]] = []
        for line in self.lines:
            if _LEVEL.match(line) or not entries:
                entries.append([line])
            else:
                entries[-1].append(line)
        return [
            entry
            for entry in entries
            if entry[0].startswith(("ERROR:", "CRITICAL:")) or any("Traceback" in x for x in entry)
        ]


# --- the bench ----------------------------------------------------------------------


async def _client(
    server: ServerProcess, args: argparse.Namespace, index: int, frames: int, tally: Tally
) -> None:
    fuzzer = FrameFuzzer(RandomSource(args.seed * 1_000 + index), oversize=True)
    # events=both: the socket gets every journaled event, both spellings, so
    # each one in the log can be matched with one received
    ws_url = server.ws_at("/v1/realtime?duplex=1&events=both")
    client = FuzzClient(ws_url, server.http_url, tally)
    while frames > 0:
        fuzzer.known = Known(event_ids=fuzzer.known.event_ids)  # a new session, new ids
        try:
            sent = await client.session(fuzzer, min(frames, args.session_frames), args.batch)
        except (OSError, websockets.WebSocketException) as exc:
            tally.fault(f"could not open a session: {exc!r}")
            return
        frames -= max(sent, 1)


async def _drive(server: ServerProcess, args: argparse.Namespace, tally: Tally) -> float:
    clients = max(1, args.sessions)
    shares = [args.frames // clients + (i < args.frames % clients) for i in range(clients)]
    started = time.perf_counter()
    await asyncio.gather(*(_client(server, args, i, n, tally) for i, n in enumerate(shares) if n))
    return time.perf_counter() - started


def run(args: argparse.Namespace) -> None:
    tally = Tally()
    cpu = GeneratorCpu()
    with tempfile.TemporaryDirectory(prefix="dxfuzz") as tmp:
        store = f"sqlite:{Path(tmp) / 'fuzz.db'}" if args.store == "sqlite" else args.store
        server = ServerProcess(store).start()
        try:
            cpu.start()
            seconds = asyncio.run(_drive(server, args, tally))
            generator = cpu.report()
        finally:
            server.stop(timeout_s=30)
            exceptions = ServerLog(server.log_text()).exceptions()
    passed = not exceptions and not tally.heartbeat_failures and not tally.faults
    print(
        json.dumps(
            {
                "bench": "fuzz",
                "seed": args.seed,
                "store": args.store,
                "frames_sent": tally.frames,
                "batches": tally.batches,
                "sessions": tally.sessions,
                "frames_per_s": round(tally.frames / seconds, 1) if seconds else None,
                "seconds": round(seconds, 2),
                "errors_by_code": dict(tally.errors_by_code.most_common()),
                "sessions_ended_by": dict(tally.ended_by.most_common()),
                "server_events_by_type": dict(tally.events_by_type.most_common()),
                "heartbeat_failures": tally.heartbeat_failures,
                "faults": len(tally.faults),
                "first_faults": tally.faults[:5],
                "fault_reproducers": tally.reproducers[:3],
                "server_exceptions": len(exceptions),
                "first_server_exception": exceptions[0][:12] if exceptions else None,
                **generator,
                **validity(generator),
                "passed": passed,
            }
        )
    )
