"""A session's system prompt as prime frames, the way PersonaPlex conditions
a Moshi-architecture model before the conversation starts.

PersonaPlex (NVIDIA's ``LMGen.step_system_prompts``) feeds, one frame each,
with every token given: the voice prompt (a recording Mimi-encoded, as the
model's own audio, its text the pad token), half a second of the model's
silence, the text prompt (``<system> ... <system>``, one text token a frame,
its audio silence), and half a second of silence again; all the while the
user's stream holds a 440 Hz tone, its stand-in for "the user says nothing
yet". This module lays those frames out as the stepper's columns; the codes
of the fixed frames come from the checkpoint's own Mimi (``PromptCodes``,
computed once when the model loads). Pure: no torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from duplex_server.engine.duplex.tokens import FrameTokens, PrimeFrame

# Frames of silence after each prompt: PersonaPlex's half second (6 frames at 12.5 Hz).
SILENCE_FRAMES = 6
# Bounds of one session's priming: it runs before the session's first frame
# is served, so its cost is capped (at most ~46 s of model time).
MAX_PROMPT_TOKENS = 256
MAX_VOICE_FRAMES = 300  # 24 s of voice prompt


def system_text(instructions: str) -> str:
    """The text prompt as PersonaPlex's model was trained to read it."""
    cleaned = instructions.strip()
    if cleaned.startswith("<system>") and cleaned.endswith("<system>"):
        return cleaned
    return f"<system> {cleaned} <system>"


@dataclass(frozen=True)
class PromptCodes:
    """The fixed tokens of a prompt, for one checkpoint: its text pad token,
    the user's codes of a 440 Hz tone at half scale, and the codes of a
    silent frame of the model's own voice."""

    pad_text: int
    user_tone: tuple[int, ...]
    silence: tuple[int, ...]


def prime_frames(
    codes: PromptCodes,
    text_tokens: Sequence[int],
    voice: Sequence[tuple[int, ...]],
) -> list[PrimeFrame]:
    """The prime frames of a voice prompt (its frames' codes) and a text
    prompt (its tokens); empty when there is neither."""
    if len(text_tokens) > MAX_PROMPT_TOKENS:
        raise ValueError(f"a text prompt of {len(text_tokens)} tokens: at most {MAX_PROMPT_TOKENS}")
    if len(voice) > MAX_VOICE_FRAMES:
        raise ValueError(f"a voice prompt of {len(voice)} frames: at most {MAX_VOICE_FRAMES}")
    pad, silent = codes.pad_text, codes.silence
    frames: list[tuple[int, tuple[int, ...]]] = []  # (text, audio codes), frame by frame
    if voice:
        frames += [(pad, tuple(frame)) for frame in voice] + [(pad, silent)] * SILENCE_FRAMES
    if text_tokens:
        frames += [(token, silent) for token in text_tokens] + [(pad, silent)] * SILENCE_FRAMES
    return _columns(frames, codes)


def _columns(frames: list[tuple[int, tuple[int, ...]]], codes: PromptCodes) -> list[PrimeFrame]:
    """Tick ``t`` is forced to column ``t + 1`` (the stepper's layout): the
    text and codebook 0 of frame ``t + 1``, codebooks 1.. of frame ``t``.
    The frame after the last is taken as silent, so the first tick of the
    conversation reads a whole column; frame 0's text and codebook 0 fall
    before the stream's first column, as in PersonaPlex."""
    if not frames:
        return []
    after = [*frames[1:], (codes.pad_text, codes.silence)]
    return [
        PrimeFrame(
            user=codes.user_tone,
            tokens=FrameTokens(next_text, (next_audio[0], *audio[1:])),
        )
        for (_, audio), (next_text, next_audio) in zip(frames, after, strict=True)
    ]
