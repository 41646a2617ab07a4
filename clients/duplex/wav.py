"""WAV and data-URL helpers (standard library only)."""

from __future__ import annotations

import base64
import wave


def read_pcm16_wav(path: str) -> tuple[bytes, int]:
    """Mono 16-bit PCM samples and their rate; anything else is refused."""
    with wave.open(path, "rb") as reader:
        if reader.getsampwidth() != 2 or reader.getnchannels() != 1:
            raise ValueError(
                f"{path}: need mono 16-bit PCM, got {reader.getnchannels()} "
                f"channel(s) of {8 * reader.getsampwidth()} bits"
            )
        return reader.readframes(reader.getnframes()), reader.getframerate()


def write_pcm16_wav(path: str, pcm: bytes, sample_rate_hz: int = 24_000) -> None:
    with wave.open(path, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(sample_rate_hz)
        writer.writeframes(pcm)


def audio_data_url(data: bytes, mime: str = "audio/wav") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
