"""Wire format <-> canonical pcm16 (signed 16-bit little-endian mono)."""

from __future__ import annotations

import numpy as np

from duplex_server.audio.g711 import ALAW_TO_PCM16, ULAW_TO_PCM16, alaw_encode, ulaw_encode
from duplex_server.audio.opus import OpusError, OpusStream, decode_packet
from duplex_server.audio.resample import StreamResampler, resample_pcm16
from protocol.audio_formats import G711_ALAW, G711_ULAW, OPUS, PCM16, PCM_F32LE, AudioFormat


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
    """Resample pcm16 at ``rate_hz`` to ``fmt`` and encode it, as a whole
    signal (a stream of chunks goes through one :class:`StreamEncoder`)."""
    return _encode(resample_pcm16(pcm, rate_hz, fmt.sample_rate_hz), fmt)


def _encode(pcm: bytes, fmt: AudioFormat) -> bytes:
    """pcm16 already at ``fmt``'s rate, in ``fmt``."""
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


class StreamEncoder:
    """One response's audio: pcm16 chunks at the model's rate in, ``fmt``
    out, with no seams between chunks. One resampler runs across the chunks
    (a new one if the model's rate changes, after the old one's tail), and
    for Opus one encoder. Each chunk comes out as long as it went in; what
    a response holds back when it ends (the resampler's ``delay``, at most
    ~12 ms, as Opus holds back a partial 20 ms packet) is not sent."""

    def __init__(self, fmt: AudioFormat) -> None:
        self._fmt = fmt
        self._resampler: StreamResampler | None = None
        self._opus: OpusStream | None = None

    def encode(self, pcm16: bytes, rate_hz: int) -> bytes:
        pcm = b""
        if self._resampler is None or self._resampler.src_hz != rate_hz:
            pcm = self._resampler.flush() if self._resampler is not None else b""
            self._resampler = StreamResampler(rate_hz, self._fmt.sample_rate_hz)
        pcm += self._resampler.push(pcm16)
        if self._fmt.name != OPUS:
            return _encode(pcm, self._fmt)
        if self._opus is None:
            self._opus = OpusStream()
        return self._opus.encode(pcm)


def pcm16_duration_ms(nbytes: int, rate_hz: int) -> float:
    return nbytes / 2 / rate_hz * 1000.0


def pcm16_rms(pcm16: bytes) -> float:
    """Root mean square of pcm16 audio, as a fraction of full scale (0 for none)."""
    samples = np.frombuffer(pcm16[: len(pcm16) // 2 * 2], dtype="<i2").astype(np.float64)
    if not samples.size:
        return 0.0
    return float(np.sqrt(np.mean(samples * samples)) / 32768.0)
