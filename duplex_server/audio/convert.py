"""Wire format <-> canonical pcm16 (signed 16-bit little-endian mono)."""

from __future__ import annotations

import numpy as np

from duplex_server.audio.g711 import ALAW_TO_PCM16, ULAW_TO_PCM16, alaw_encode, ulaw_encode
from duplex_server.audio.opus import OpusError, OpusStream, decode_packet
from protocol.audio_formats import G711_ALAW, G711_ULAW, OPUS, PCM16, PCM_F32LE, AudioFormat

_LOWPASS_TAPS = 63


class AudioDecodeError(ValueError):
    """Bytes that cannot be audio of the declared format (e.g. odd pcm16 length)."""


def _samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2")


def decode_to_pcm16(data: bytes, fmt: AudioFormat) -> bytes:
    if fmt.name == PCM16:
        if len(data) % 2:
            raise AudioDecodeError(f"pcm16 needs an even byte count, got {len(data)} bytes")
        return data
    if fmt.name == PCM_F32LE:
        if len(data) % 4:
            raise AudioDecodeError(f"pcm_f32le needs a multiple of 4 bytes, got {len(data)} bytes")
        floats = np.frombuffer(data, dtype="<f4")
        if not np.all(np.isfinite(floats)):
            raise AudioDecodeError("pcm_f32le contains NaN or infinite samples")
        return (np.clip(floats, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    if fmt.name == OPUS:
        try:
            return decode_packet(data)
        except OpusError as exc:
            raise AudioDecodeError(str(exc)) from None
    codes = np.frombuffer(data, dtype=np.uint8)
    if fmt.name == G711_ULAW:
        return ULAW_TO_PCM16[codes].astype("<i2").tobytes()
    if fmt.name == G711_ALAW:
        return ALAW_TO_PCM16[codes].astype("<i2").tobytes()
    raise AudioDecodeError(f"cannot decode {fmt.name}")


def encode_from_pcm16(pcm: bytes, rate_hz: int, fmt: AudioFormat) -> bytes:
    """Resample pcm16 at ``rate_hz`` to ``fmt`` and encode it."""
    pcm = resample_pcm16(pcm, rate_hz, fmt.sample_rate_hz)
    if fmt.name == PCM16:
        return pcm
    samples = _samples(pcm)
    if fmt.name == PCM_F32LE:
        return (samples.astype(np.float32) / 32768.0).astype("<f4").tobytes()
    if fmt.name == G711_ULAW:
        return ulaw_encode(samples).tobytes()
    if fmt.name == G711_ALAW:
        return alaw_encode(samples).tobytes()
    if fmt.name == OPUS:  # a stand-alone chunk; a response streams through one OpusStream
        return OpusStream().encode(pcm)
    raise AudioDecodeError(f"cannot encode {fmt.name}")


def _lowpass(signal: np.ndarray, cutoff: float) -> np.ndarray:
    """Windowed-sinc FIR; ``cutoff`` is a fraction of the sample rate (< 0.5)."""
    n = np.arange(_LOWPASS_TAPS) - (_LOWPASS_TAPS - 1) / 2
    taps = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hamming(_LOWPASS_TAPS)
    taps /= taps.sum()
    return np.convolve(signal, taps, mode="same")


def resample_pcm16(pcm: bytes, src_hz: int, dst_hz: int) -> bytes:
    """Band-limited linear resampling; keeps tone frequencies, not aliases."""
    if src_hz == dst_hz or not pcm:
        return pcm
    signal = _samples(pcm).astype(np.float64)
    if dst_hz < src_hz:
        signal = _lowpass(signal, 0.45 * dst_hz / src_hz)
    count = max(1, round(len(signal) * dst_hz / src_hz))
    positions = np.arange(count) * (src_hz / dst_hz)
    out = np.interp(positions, np.arange(len(signal)), signal)
    return np.clip(np.round(out), -32768, 32767).astype("<i2").tobytes()


def pcm16_duration_ms(nbytes: int, rate_hz: int) -> float:
    return nbytes / 2 / rate_hz * 1000.0


def pcm16_rms(pcm16: bytes) -> float:
    """Root mean square of pcm16 audio, as a fraction of full scale (0 for none)."""
    samples = np.frombuffer(pcm16[: len(pcm16) // 2 * 2], dtype="<i2").astype(np.float64)
    if not samples.size:
        return 0.0
    return float(np.sqrt(np.mean(samples * samples)) / 32768.0)
