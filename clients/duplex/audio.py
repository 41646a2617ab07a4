"""``AudioFormat``: an encoding and a rate, and the byte/duration arithmetic on them.

The server announces a session's true formats in ``session.duplex`` (OpenAI's
format fields cannot say ``pcm_f32le`` or 22.05 kHz); the client reads them
from there, so it stamps appends and times answers in the formats the server
actually applies, not the ones it hoped to get.
"""

from __future__ import annotations

import msgspec

from protocol import server_events as se
from protocol.audio_formats import DEFAULT_RATE, G711_ALAW, G711_ULAW, PCM16, PCM_F32LE

# Opus has no entry: its packets carry no fixed number of samples per byte.
_BYTES_PER_SAMPLE = {PCM16: 2, PCM_F32LE: 4, G711_ULAW: 1, G711_ALAW: 1}


class AudioFormat(msgspec.Struct, frozen=True):
    """One wire format, in the server's names (``pcm16``, ``pcm_f32le``, ...)."""

    encoding: str
    sample_rate_hz: int

    @property
    def timed_by_size(self) -> bool:
        """Whether a byte count says how long the audio lasts (PCM and G.711 do)."""
        return self.encoding in _BYTES_PER_SAMPLE

    @property
    def bytes_per_sample(self) -> int:
        try:
            return _BYTES_PER_SAMPLE[self.encoding]
        except KeyError:
            raise ValueError(f"{self.encoding} audio has no fixed bytes per sample") from None

    def duration_ms(self, byte_count: int) -> float:
        return byte_count * 1000.0 / (self.sample_rate_hz * self.bytes_per_sample)

    def byte_count(self, duration_ms: float) -> int:
        """The whole samples that ``duration_ms`` of audio takes, in bytes."""
        return round(self.sample_rate_hz * duration_ms / 1000.0) * self.bytes_per_sample

    @classmethod
    def described(cls, description: se.AudioFormatDescription) -> AudioFormat:
        return cls(description.type, description.rate)


DEFAULT = AudioFormat(PCM16, DEFAULT_RATE[PCM16])  # OpenAI's: what a session starts with


def session_formats(session: se.SessionObject | None) -> tuple[AudioFormat, AudioFormat]:
    """(input, output) as the server applies them; OpenAI's default when it
    announced none (a session object without the ``duplex`` extension)."""
    if session is None or session.duplex is None:
        return DEFAULT, DEFAULT
    duplex = session.duplex
    return AudioFormat.described(duplex.input_format), AudioFormat.described(duplex.output_format)
