"""Audio format names on the wire and their canonical form.

Clients spell formats several ways (``pcm16``, ``pcm_s16le``, ``s16le``, GA
``{"type": "audio/pcm", "rate": 24000}``); everything inside the server uses
the canonical :class:`AudioFormat`.
"""

from __future__ import annotations

import msgspec

from protocol.errors import ProtocolError
from protocol.session_config import AudioFormatObject, AudioFormatSpec

PCM16 = "pcm16"
PCM_F32LE = "pcm_f32le"
G711_ULAW = "g711_ulaw"
G711_ALAW = "g711_alaw"
OPUS = "opus"

_ALIASES = {
    "pcm16": PCM16,
    "pcm_s16le": PCM16,
    "s16le": PCM16,
    "audio/pcm": PCM16,
    "pcm_f32le": PCM_F32LE,
    "f32le": PCM_F32LE,
    "g711_ulaw": G711_ULAW,
    "audio/pcmu": G711_ULAW,
    "pcmu": G711_ULAW,
    "g711_alaw": G711_ALAW,
    "audio/pcma": G711_ALAW,
    "pcma": G711_ALAW,
    "opus": OPUS,
    "audio/opus": OPUS,
}

DEFAULT_RATE = {PCM16: 24_000, PCM_F32LE: 24_000, G711_ULAW: 8_000, G711_ALAW: 8_000, OPUS: 48_000}
# Rates a codec is defined at; None = any rate the client declares.
# The rates the server serves, in and out.
MIN_RATE_HZ = 8_000
MAX_RATE_HZ = 48_000

FIXED_RATE = {G711_ULAW: 8_000, G711_ALAW: 8_000, OPUS: 48_000}

# Formats the server decodes and encodes.
SUPPORTED_INPUT = (PCM16, PCM_F32LE, G711_ULAW, G711_ALAW, OPUS)
SUPPORTED_OUTPUT = (PCM16, G711_ULAW, G711_ALAW, OPUS)


class AudioFormat(msgspec.Struct, frozen=True):
    name: str
    sample_rate_hz: int


def canonical_name(name: str, *, param: str, supported: tuple[str, ...]) -> str:
    canonical = _ALIASES.get(name.lower())
    if canonical is None or canonical not in supported:
        raise ProtocolError(
            "invalid_audio",
            f"unsupported audio format {name!r}; supported: {', '.join(supported)}",
            param=param,
        )
    return canonical


def resolve_format(
    spec: AudioFormatSpec,
    *,
    param: str,
    supported: tuple[str, ...],
    rate_hz: int | None = None,
) -> AudioFormat:
    """Turn any wire spelling (plus an optional explicit rate) into an AudioFormat."""
    if isinstance(spec, AudioFormatObject):
        name = canonical_name(spec.type, param=param, supported=supported)
        rate = spec.rate if isinstance(spec.rate, int) else None
    else:
        name = canonical_name(spec, param=param, supported=supported)
        rate = None
    rate = rate_hz or rate or DEFAULT_RATE[name]
    if not MIN_RATE_HZ <= rate <= MAX_RATE_HZ:
        # Every rate reaches a resampler: an absurd one is work without bound.
        raise ProtocolError(
            "invalid_audio",
            f"sample rate {rate} Hz is outside the rates served ({MIN_RATE_HZ}-{MAX_RATE_HZ} Hz)",
            param=param,
        )
    fixed = FIXED_RATE.get(name)
    if fixed is not None and rate != fixed:
        raise ProtocolError(
            "invalid_audio", f"{name} is defined at {fixed} Hz, not {rate} Hz", param=param
        )
    return AudioFormat(name, rate)


def ga_type(name: str) -> str:
    return {PCM16: "audio/pcm", G711_ULAW: "audio/pcmu", G711_ALAW: "audio/pcma"}.get(
        name, f"audio/{name}"
    )
