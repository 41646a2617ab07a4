"""Audio files through PyAV: encoding the batch API's speech
(``response_format``) and decoding any upload PyAV reads (transcriptions).

Imported by the batch routes only when they run: PyAV loads FFmpeg.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

# response_format -> (muxer, encoder, sample rates the encoder takes or None: any)
FORMATS: dict[str, tuple[str, str, tuple[int, ...] | None]] = {
    "mp3": ("mp3", "libmp3lame", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "opus": ("ogg", "libopus", (8000, 12000, 16000, 24000, 48000)),
    "aac": ("adts", "aac", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "flac": ("flac", "flac", None),
    "wav": ("wav", "pcm_s16le", None),
}
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
FRAME_SAMPLES = 4800


class AudioFileError(ValueError):
    """An upload PyAV cannot read as audio."""


def rate_supported(response_format: str, rate: int) -> bool:
    if response_format == "pcm":
        return True
    rates = FORMATS[response_format][2]
    return rates is None or rate in rates


class _Sink:
    """A write-only, unseekable output: the muxer writes as it goes (a WAV
    header then says "size unknown"), so the bytes can be sent at once."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class AudioEncoder:
    """One file, encoded as pcm16 arrives: :meth:`push` returns what the
    muxer has written so far, :meth:`finish` the rest. ``seekable=False``
    for a body sent while it is made; ``True`` writes a complete header."""

    def __init__(self, response_format: str, sample_rate_hz: int, seekable: bool = False) -> None:
        self.format = response_format
        self.rate = sample_rate_hz
        self._buffer: io.BytesIO | None = None
        self._held: list[bytes] | None = [] if seekable else None  # pcm, sent whole
        if response_format == "pcm":
            return
        import av

        self._av = av
        muxer, codec, _ = FORMATS[response_format]
        self._sink = _Sink()
        if seekable:
            self._buffer = io.BytesIO()
        target: Any = self._buffer if seekable else self._sink
        self._container = av.open(target, "w", format=muxer, options={"fflags": "+bitexact"})
        stream: Any = self._container.add_stream(codec, rate=sample_rate_hz)
        stream.layout = "mono"
        self._stream = stream

    def push(self, pcm16: bytes) -> bytes:
        if self.format == "pcm":
            if self._held is not None:
                self._held.append(pcm16)
                return b""
            return pcm16
        samples = np.frombuffer(pcm16, dtype=np.int16)
        for start in range(0, len(samples), FRAME_SAMPLES):
            frame = self._av.AudioFrame.from_ndarray(
                samples[None, start : start + FRAME_SAMPLES], format="s16", layout="mono"
            )
            frame.sample_rate = self.rate
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.take()

    def finish(self) -> bytes:
        if self.format == "pcm":
            return b"".join(self._held or [])
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        if self._buffer is not None:
            return self._buffer.getvalue()
        return self._sink.take()


def encode(pcm16: bytes, response_format: str, sample_rate_hz: int) -> bytes:
    """A whole file (its header knows its length)."""
    encoder = AudioEncoder(response_format, sample_rate_hz, seekable=True)
    encoder.push(pcm16)
    return encoder.finish()


def decode(data: bytes, sample_rate_hz: int, max_seconds: float) -> bytes:
    """Mono pcm16 at ``sample_rate_hz`` of the first audio stream of any file
    PyAV reads; AudioFileError for anything else, or for longer audio."""
    import av

    limit = int(max_seconds * sample_rate_hz)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=sample_rate_hz)
    chunks: list[np.ndarray] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), "r") as container:
            if not container.streams.audio:
                raise AudioFileError("the file has no audio stream")
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1)
                    total += len(chunk)
                    if total > limit:
                        raise AudioFileError(f"the audio is longer than {max_seconds:.0f} s")
                    chunks.append(chunk)
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
    except av.error.FFmpegError as exc:
        raise AudioFileError(f"not an audio file PyAV can decode ({exc.strerror})") from None
    if not chunks or sum(len(c) for c in chunks) == 0:
        raise AudioFileError("the file decodes to no audio")
    return np.concatenate(chunks).astype(np.int16).tobytes()
