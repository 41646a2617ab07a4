"""A session's system prompt laid out as prime frames, PersonaPlex's way:
voice prompt, silence, text prompt, silence; every tick forced to the
stepper's next column (text and codebook 0 of the next frame, codebooks 1..
of this one); the user's stream a fixed tone throughout. Bounded."""

from __future__ import annotations

import pytest

from duplex_server.engine.duplex.prime import (
    MAX_PROMPT_TOKENS,
    SILENCE_FRAMES,
    PromptCodes,
    prime_frames,
    system_text,
)
from duplex_server.engine.duplex.tokens import FrameTokens

CODES = PromptCodes(pad_text=3, user_tone=(40, 41, 42), silence=(0, 1, 2))


def test_no_prompt_primes_nothing():
    assert prime_frames(CODES, [], []) == []


def test_voice_then_silence_then_text_then_silence_as_columns():
    voice = [(10, 11, 12), (20, 21, 22)]
    frames = prime_frames(CODES, [7, 8], voice)
    assert len(frames) == 2 + SILENCE_FRAMES + 2 + SILENCE_FRAMES
    assert all(f.user == CODES.user_tone for f in frames)
    # tick 0: column 1 = voice frame 1's text (pad) and codebook 0, frame 0's codebooks 1..
    assert frames[0].tokens == FrameTokens(3, (20, 11, 12))
    # tick 1: the first silent frame follows the voice
    assert frames[1].tokens == FrameTokens(3, (0, 21, 22))
    text_at = 2 + SILENCE_FRAMES
    assert frames[text_at - 1].tokens == FrameTokens(7, (0, 1, 2))  # the text's first token
    assert frames[text_at].tokens == FrameTokens(8, (0, 1, 2))
    assert frames[text_at + 1].tokens == FrameTokens(3, (0, 1, 2))
    # the last tick reads as if a silent frame followed
    assert frames[-1].tokens == FrameTokens(3, (0, 1, 2))


def test_the_text_prompt_is_wrapped_in_system_tags_once():
    assert system_text("  Be kind. ") == "<system> Be kind. <system>"
    assert system_text("<system> x <system>") == "<system> x <system>"


def test_prompts_are_bounded():
    with pytest.raises(ValueError, match="at most"):
        prime_frames(CODES, [5] * (MAX_PROMPT_TOKENS + 1), [])
