"""What a native duplex model decides in one tick, as plain integers: the
record a session logs so that a restarted replica can rebuild the model's
state by a teacher-forced prefill, and the frames a session is primed with
(its persona and voice prompt) before the first frame of its user."""

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


@dataclass(frozen=True)
class PrimeFrame:
    """One tick of a session's system prompt, every token given.

    ``user`` is what the user's stream holds in that frame (its codebooks,
    frame-aligned: the stepper delays codebooks 1.. itself, as it does for
    encoded input); ``tokens`` the model's own column the tick is forced to
    take (laid out as :class:`FrameTokens`). No audio goes through the
    user's codec: a primed row's encoder starts fresh at its first real
    frame. A resumed session replays its prime frames before its logged ones.
    """

    user: tuple[int, ...]
    tokens: FrameTokens
