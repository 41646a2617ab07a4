"""Where speech is in a recording: stretches of sound between pauses, for
cutting a long upload into segments a recogniser decodes one by one (each
with its own start and end, the timestamps of a transcription's segments).

Energy only: a frame is sound when its RMS passes a tenth of the loud
frames' level (and an absolute floor), so it works on any recording without
a model; a stretch ends at a pause of ``min_pause_s``.
"""

from __future__ import annotations

import numpy as np

FRAME_S = 0.02
FLOOR_RMS = 100.0  # of 32,768: quieter than this is silence whatever the level
PAD_S = 0.15  # kept around each stretch: word edges are quiet


def speech_stretches(
    pcm16: bytes, rate: int, *, min_pause_s: float = 0.35, max_s: float = 28.0
) -> list[tuple[float, float]]:
    """(start, end) seconds of each stretch of sound, none longer than ``max_s``."""
    samples = np.frombuffer(pcm16, dtype=np.int16).astype(np.float32)
    frame = max(1, int(rate * FRAME_S))
    count = len(samples) // frame
    if count == 0:
        return []
    frames = samples[: count * frame].reshape(count, frame)
    rms = np.sqrt((frames**2).mean(axis=1))
    loud = float(np.percentile(rms, 95))
    sound = rms > max(FLOOR_RMS, loud / 10)
    stretches: list[tuple[float, float]] = []
    gap = int(min_pause_s / FRAME_S)
    start = None
    quiet = 0
    for index, on in enumerate(sound):
        if on:
            start = index if start is None else start
            quiet = 0
        elif start is not None:
            quiet += 1
            if quiet >= gap:
                stretches.append((start * FRAME_S, (index - quiet + 1) * FRAME_S))
                start, quiet = None, 0
    if start is not None:
        stretches.append((start * FRAME_S, (count - quiet) * FRAME_S))
    total = len(samples) / rate
    padded = [(max(0.0, a - PAD_S), min(total, b + PAD_S)) for a, b in stretches]
    return [(round(a, 3), round(b, 3)) for s, e in padded for a, b in _at_most(s, e, max_s)]


def _at_most(start: float, end: float, max_s: float) -> list[tuple[float, float]]:
    pieces = []
    while end - start > max_s:
        pieces.append((start, start + max_s))
        start += max_s
    pieces.append((start, end))
    return pieces
