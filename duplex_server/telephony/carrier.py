"""What a carrier's media stream says, in words that are no carrier's own.

Carriers that stream a call over a WebSocket (Twilio, Telnyx, Vonage) differ
in the shapes of their messages and little else: the call starts (with its
ids, numbers and the parameters the call webhook set), audio arrives in
small frames, the carrier echoes the marks the server put after its audio
once that audio has played, the caller presses keys, the call stops. A
:class:`CarrierDialect` reads one carrier's frames into these messages and
writes the three things the server sends back (audio, a mark, a clear);
``telephony/call.py`` drives a session with them and knows no carrier.

A new carrier is one module: a dialect (``parse``, ``media``, ``mark``,
``clear``, its audio format) and a route that verifies the carrier's
requests and hands the socket to ``call.serve_call``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class CarrierFrameError(ValueError):
    """A frame the dialect cannot read (not JSON, not the carrier's shape, an
    unknown event); the call drops it, logs why, and goes on."""


@dataclass(frozen=True)
class CallConnected:
    """The socket is the carrier's (Twilio's ``connected``); nothing starts yet."""


@dataclass(frozen=True)
class CallStarted:
    stream_id: str
    call_id: str
    # The parameters the call webhook put on the stream (called and calling
    # numbers among them): the carrier echoes them here.
    parameters: dict[str, str] = field(default_factory=dict)
    # The audio the carrier sends, as the server names formats ("g711_ulaw").
    audio_format: str = "g711_ulaw"
    sample_rate_hz: int = 8000


@dataclass(frozen=True)
class CallAudio:
    """One frame of the caller's audio, base64 as the carrier sent it."""

    stream_id: str
    payload: str


@dataclass(frozen=True)
class CallMark:
    """The audio before the mark named ``name`` has played to the caller."""

    stream_id: str
    name: str


@dataclass(frozen=True)
class CallDigit:
    """The caller pressed a key (DTMF)."""

    stream_id: str
    digit: str


@dataclass(frozen=True)
class CallStopped:
    """The carrier ended the stream (the caller hung up, or the call moved on)."""

    stream_id: str


@dataclass(frozen=True)
class Ignored:
    """A frame the call has no use for, and why (a frame of the outbound
    track the carrier echoes, say): dropped, not an error."""

    reason: str


CarrierMessage = (
    CallConnected | CallStarted | CallAudio | CallMark | CallDigit | CallStopped | Ignored
)


class CarrierDialect(Protocol):
    """One carrier's media stream messages."""

    name: str
    # The format of the audio both ways, as the server names it.
    audio_format: str

    def parse(self, frame: str | bytes) -> CarrierMessage:
        """The frame as a carrier-neutral message; raises :class:`CarrierFrameError`."""
        ...

    def media(self, stream_id: str, payload: str) -> str:
        """A frame that plays ``payload`` (base64, ``audio_format``) to the caller."""
        ...

    def mark(self, stream_id: str, name: str) -> str:
        """A frame the carrier echoes once the audio sent before it has played."""
        ...

    def clear(self, stream_id: str) -> str:
        """A frame that drops the audio the carrier holds but has not played."""
        ...
