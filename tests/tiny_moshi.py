"""The tests' tiny random Moshi-architecture checkpoints: the bench's
(``duplex_bench.tiny_moshi``: the real structure at toy widths, built
with ``save_pretrained``), and every one ships a word-level tokenizer
(``<pad>`` at id 3, as in Moshi's), so text tokens become transcript words
and a persona can be primed.

``talking_moshi`` is the same architecture with weights set by hand so its
behaviour is known: it pads while the user talks, answers with ``WORDS``
(one a frame) once the user falls silent, then pads until the user speaks
again. Its temporal layers add nothing (their output projections are zero),
so the text it picks is a fixed function of the text it picked last and of
whether the user's codebook 0 is one Mimi gives silence; its voice comes
from the random depth decoder and Mimi, as any checkpoint's would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from duplex_bench.tiny_moshi import (
    AUDIO_VOCAB,
    FRAME_SAMPLES,
    MIMI_SLIDING_WINDOW,
    NUM_CODEBOOKS,
    SAMPLE_RATE,
    TEXT_VOCAB,
)
from duplex_bench.tiny_moshi import tiny_moshi as build_tiny_moshi

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3; <pad> is the text pad, as Moshi's
PAD = 3
# the checkpoint's shape is the bench's; tests name it from here
__all__ = ["AUDIO_VOCAB", "FRAME_SAMPLES", "MIMI_SLIDING_WINDOW", "NUM_CODEBOOKS", "SAMPLE_RATE"]

WORDS = ("hello", "there", "how", "are", "you", "doing", "today", "friend")
PROMPT_WORDS = ("<system>", "be", "a", "kind", "pirate", "speak", "slowly")
ANSWER = "".join(" " + word for word in WORDS)  # the talking model's transcript
SPEECH_AMPLITUDE = 0.3


def tiny_moshi(directory: Path, seed: int = 0, window: int = 3000) -> Path:
    """The bench's tiny random checkpoint (``duplex_bench.tiny_moshi``)
    with the word-level tokenizer below saved beside it."""
    build_tiny_moshi(directory, seed, window)
    save_tokenizer(directory)
    return directory


def vocabulary() -> list[str]:
    pieces = [*SPECIALS, *("\u2581" + word for word in (*WORDS, *PROMPT_WORDS))]
    assert len(pieces) <= TEXT_VOCAB and len(set(pieces)) == len(pieces)
    return pieces


def save_tokenizer(directory: Path) -> None:
    """A word-level tokenizer over ``vocabulary()`` with sentencepiece's
    word marks (``\u2581hello``), saved as transformers saves any."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {piece: index for index, piece in enumerate(vocabulary())}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.save_pretrained(directory)


def token_id(word: str) -> int:
    return vocabulary().index("\u2581" + word)


# --- the talking model ---------------------------------------------------------

# Hidden dimensions the hand-set weights use: the user talking or silent, and
# the class of the text token picked last.
TALKING, SILENT, HEARD, IDLE = 0, 1, 2, 3
WORD_DIMS = 4  # WORDS[i] is dimension 4 + i


def talking_moshi(directory: Path, seed: int = 0) -> Path:
    """``tiny_moshi`` with its text set by hand (the module's docstring), and
    the seed of a speech-like noise whose frames Mimi never codes as silence
    (``talking.json``; ``speech_pcm16`` reads it)."""
    import torch
    from transformers import MoshiForConditionalGeneration

    tiny_moshi(directory, seed)
    model = MoshiForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    silent = silent_codes(model)
    with torch.no_grad():
        _hand_set_text(model, silent)
    speech_seed = _speech_seed(model, silent)
    model.save_pretrained(directory)
    (directory / "talking.json").write_text(json.dumps({"speech_seed": speech_seed}))
    return directory


def _hand_set_text(model: object, silent: set[int]) -> None:
    """Zero every temporal layer's output and every audio embedding but the
    user's codebook 0; embed the text and that codebook as one-hot classes;
    the text head maps (class of the last text, user silent or talking) to
    the next text: talking -> <unk> (heard), silent after <unk> -> WORDS[0],
    after WORDS[i] -> WORDS[i+1], after the last word or anything else -> <pad>."""
    import torch

    decoder = model.decoder  # type: ignore[attr-defined]
    for name, parameter in decoder.model.layers.named_parameters():
        if name.endswith(("o_proj.weight", "fc2.weight")):
            parameter.zero_()
    hidden = decoder.model.embed_tokens.weight.shape[1]
    unit = torch.eye(hidden)
    text = decoder.model.embed_tokens.weight
    text.copy_(unit[IDLE].expand_as(text))
    text[0] = unit[HEARD]
    words = [token_id(word) for word in WORDS]
    for i, token in enumerate(words):
        text[token] = unit[WORD_DIMS + i]
    for table in model.embed_tokens:  # type: ignore[attr-defined]
        table.weight.zero_()
    user0 = model.embed_tokens[NUM_CODEBOOKS].weight  # type: ignore[attr-defined]
    for code in range(user0.shape[0]):
        user0[code] = unit[SILENT] if code in silent else unit[TALKING]
    head = decoder.lm_head.weight
    head.zero_()
    head[0, TALKING] = 3.0
    head[words[0], SILENT] = head[words[0], HEARD] = 1.0
    for i in range(1, len(words)):
        head[words[i], SILENT] = head[words[i], WORD_DIMS + i - 1] = 1.0
    head[PAD, SILENT] = head[PAD, IDLE] = head[PAD, WORD_DIMS + len(words) - 1] = 1.0


def silent_codes(model: object) -> set[int]:
    """Codebook-0 codes Mimi gives digital silence (from its first frame on)."""
    import torch

    zeros = torch.zeros(1, 1, 12 * FRAME_SAMPLES)
    codes = model.audio_encoder.encode(zeros, num_quantizers=NUM_CODEBOOKS).audio_codes  # type: ignore[attr-defined]
    return set(codes[0, 0].tolist())


def speech_samples(seed: int, units: int) -> np.ndarray:
    generator = np.random.default_rng(seed)
    return (generator.standard_normal(units * FRAME_SAMPLES) * SPEECH_AMPLITUDE).astype(np.float32)


def _speech_seed(model: object, silent: set[int]) -> int:
    """A noise seed whose frames, after silence and between silences, are
    never coded as silence: the talking model then always hears it as speech."""
    import torch

    quiet = np.zeros(8 * FRAME_SAMPLES, dtype=np.float32)
    for seed in range(100):
        speech = speech_samples(seed, 12)
        signal = np.concatenate([quiet, speech, quiet, speech, quiet])
        wave = torch.from_numpy(signal)[None, None, :]
        codes = model.audio_encoder.encode(wave, num_quantizers=NUM_CODEBOOKS).audio_codes  # type: ignore[attr-defined]
        first = codes[0, 0].tolist()
        spoken = first[8:20] + first[28:40]
        settled = first[4:8] + first[24:28] + first[44:48]
        if not silent & set(spoken) and set(settled) <= silent:
            return seed
    raise RuntimeError("no noise seed that Mimi tells from silence: change the tiny codec")


def float64_moshi(directory: Path, **config: object) -> Any:
    """The checkpoint loaded in float64 (the tests compare runs exactly),
    with ``config`` over its own settings."""
    import torch
    from transformers import MoshiForConditionalGeneration

    return MoshiForConditionalGeneration.from_pretrained(
        directory, dtype=torch.float64, **config
    ).eval()


def windowed(directory: Path, window: int) -> object:
    """The checkpoint loaded in float64 with a temporal window of ``window``
    frames (short, so that a few ticks cross it)."""
    return float64_moshi(directory, sliding_window=window)


def noise_signals(seed: int, streams: int, samples: int) -> list[np.ndarray]:
    """``streams`` input signals of ``samples`` samples of speech-level noise."""
    generator = np.random.default_rng(seed)
    return [(generator.standard_normal(samples) * 0.3).astype(np.float32) for _ in range(streams)]


def frame(signal: Any, index: int) -> Any:
    """Frame ``index`` of a signal (an array or tensor, samples last)."""
    return signal[..., index * FRAME_SAMPLES : (index + 1) * FRAME_SAMPLES]


def noise_frames(seed: int, streams: int, ticks: int) -> list[list[np.ndarray]]:
    """``streams`` streams of ``ticks`` frames of speech-level noise."""
    noise = np.random.default_rng(seed)
    return [
        [(noise.standard_normal(FRAME_SAMPLES) * 0.3).astype(np.float32) for _ in range(ticks)]
        for _ in range(streams)
    ]


def speech_pcm16(directory: Path, units: int) -> bytes:
    """``units`` 80 ms units of the noise ``talking_moshi`` hears as speech."""
    seed = json.loads((directory / "talking.json").read_text())["speech_seed"]
    return (speech_samples(seed, units) * 32767).astype("<i2").tobytes()
