"""What a native duplex model decides in one tick, as plain integers: the
record a session logs so that a restarted replica can rebuild the model's
state by a teacher-forced prefill."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FrameTokens:
    """The tokens one row's model generated in one tick.

    Moshi delays every codebook but the first by one frame, so a tick's
    generated column is the text token and codebook 0 of the *next* frame
    and codebooks 1.. of the *current* one. ``text`` and ``audio`` are that
    column exactly as generated (``audio[0]`` is codebook 0), which is what
    a teacher-forced prefill must feed back.
    """

    text: int
    audio: tuple[int, ...]
