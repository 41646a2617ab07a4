"""``--voices DIR``: the voice prompts a ``moshi`` session may name.

Each audio file PyAV decodes in the directory (``.wav``, ``.flac``,
``.mp3``, ``.ogg``, ``.opus``, ``.m4a``) is a voice named by its file stem
(``NATF2.wav`` is ``NATF2``). They are read at start-up, so a directory
that is missing, empty, too full, or holds a file that does not decode or
runs too long stops ``serve`` with the reason, never a session's tick.
Samples are levelled to -24 dBFS RMS (PersonaPlex levels its prompts to
-24 LUFS) and kept as float at 24 kHz until the model encodes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from duplex_server.audio.containers import AudioFileError, decode

RATE_HZ = 24_000
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a")
MAX_VOICES = 64
MAX_VOICE_S = 24.0  # prime.MAX_VOICE_FRAMES at 12.5 frames a second
MAX_FILE_BYTES = 32 * 1024 * 1024
TARGET_RMS = 10 ** (-24 / 20)


class VoicesError(ValueError):
    """``--voices DIR`` cannot be served; the message says why."""


def load_voices(directory: str) -> dict[str, np.ndarray]:
    """Every voice prompt of ``directory``, by name."""
    root = Path(directory)
    where = f"--voices {directory}"
    if not root.is_dir():
        raise VoicesError(f"{where}: no such directory")
    files = sorted(p for p in root.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES)
    if not files:
        raise VoicesError(f"{where}: no audio file ({', '.join(AUDIO_SUFFIXES)})")
    if len(files) > MAX_VOICES:
        raise VoicesError(f"{where}: {len(files)} voices; at most {MAX_VOICES}")
    voices: dict[str, np.ndarray] = {}
    for path in files:
        if path.stem in voices:
            raise VoicesError(f"{where}: two files name the voice {path.stem!r}")
        voices[path.stem] = _read(path, where)
    return voices


def _read(path: Path, where: str) -> np.ndarray:
    if path.stat().st_size > MAX_FILE_BYTES:
        raise VoicesError(f"{where}: {path.name} is over {MAX_FILE_BYTES // 2**20} MiB")
    try:
        pcm = decode(path.read_bytes(), RATE_HZ, MAX_VOICE_S)
    except AudioFileError as exc:
        raise VoicesError(f"{where}: {path.name}: {exc}") from None
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
    rms = float(np.sqrt(np.mean(np.square(samples))))
    if rms < 1e-4:
        raise VoicesError(f"{where}: {path.name} is silent")
    return np.clip(samples * (TARGET_RMS / rms), -1.0, 1.0).astype(np.float32)
