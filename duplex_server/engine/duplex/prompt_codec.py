"""The Mimi codes a prompt is made of, from the checkpoint's own codec:
a voice prompt's frames, and the fixed frames (the user's 440 Hz tone, the
model's silence) of ``prime.PromptCodes``. Run once when the model loads,
on the engine's thread."""

from __future__ import annotations

import numpy as np
import torch
from transformers import MoshiForConditionalGeneration

from duplex_server.engine.duplex.prime import PromptCodes

TONE_HZ = 440.0
TONE_AMPLITUDE = 0.5
# A fixed frame's codes are those of the last of this many identical frames
# (the codec's convolutions and transformer past their start).
STEADY_FRAMES = 4


@torch.no_grad()
def encode_frames(
    model: MoshiForConditionalGeneration, samples: np.ndarray
) -> list[tuple[int, ...]]:
    """Each 80 ms frame's codebooks of ``samples`` (float, 24 kHz), the last
    frame padded with silence."""
    mimi = model.audio_encoder
    frame = int(mimi.config.frame_size)
    whole = -(-len(samples) // frame) * frame
    padded = np.zeros(whole, dtype=np.float32)
    padded[: len(samples)] = samples
    wave = torch.from_numpy(padded).to(model.device, model.dtype)[None, None, :]
    codes = mimi.encode(wave, num_quantizers=model.config.num_codebooks).audio_codes
    return [tuple(int(code) for code in column) for column in codes[0].T.tolist()]


def prompt_codes(model: MoshiForConditionalGeneration, pad_text: int) -> PromptCodes:
    frame = int(model.audio_encoder.config.frame_size)
    rate = int(model.audio_encoder.config.sampling_rate)
    t = np.arange(frame * STEADY_FRAMES) / rate
    tone = (TONE_AMPLITUDE * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)
    silence = np.zeros(frame * STEADY_FRAMES, dtype=np.float32)
    return PromptCodes(
        pad_text=pad_text,
        user_tone=encode_frames(model, tone)[-1],
        silence=encode_frames(model, silence)[-1],
    )
