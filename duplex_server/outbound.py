"""The fields of a journaled server event that a media shell needs.

A carrier's stream (``telephony/call.py``) and a WebRTC call
(``webrtc/transport.py``) both read the session's journal and turn its audio
into media of their own; they decode each event into :class:`Outbound`,
which keeps only what they use (the rest of the event is skipped unread).
"""

from __future__ import annotations

import msgspec

# The answer's audio in either dialect's spelling (GA, beta).
AUDIO_DELTAS = frozenset((b"response.output_audio.delta", b"response.audio.delta"))
AUDIO_DONE = frozenset((b"response.output_audio.done", b"response.audio.done"))


class _Ledger(msgspec.Struct):
    sent_ms: float


class _DeltaMetadata(msgspec.Struct):
    playback: _Ledger | None = None


class Refusal(msgspec.Struct):
    code: str = ""
    message: str = ""


class Outbound(msgspec.Struct):
    type: str
    response_id: str = ""
    delta: str = ""
    format: str = "pcm16"
    sample_rate_hz: int = 24000
    metadata: _DeltaMetadata | None = None
    error: Refusal | None = None

    @property
    def sent_ms(self) -> float | None:
        """The session's ledger after this delta: its audio sent, in ms."""
        ledger = self.metadata.playback if self.metadata is not None else None
        return ledger.sent_ms if ledger is not None else None


read_outbound = msgspec.json.Decoder(Outbound).decode
