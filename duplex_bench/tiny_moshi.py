"""Tiny random Moshi-architecture checkpoints built here with ``save_pretrained``:
``tiny_moshi`` (the one ``bench duplex-model`` serves without ``--model``, and
the tests' random one) and ``talking_moshi`` (the tests' hand-set one).

They have the real structure (a temporal transformer over text + user and model
audio codes, a depth decoder that emits a frame's codebooks one by one, and a
Mimi codec at 24 kHz with the standard up-sampling ratios, so a frame is 1920
samples) at toy widths, and load through the same code path as a converted
Moshi or PersonaPlex checkpoint. Two details make a random one usable:

- a random ``MimiModel`` starts with all-zero codebooks (every frame would
  quantise to code 0), so the codebooks are randomised before saving;
- the depth decoder's ``sliding_window`` must be at least its number of
  codebooks, or its cache forgets the frame's first codes.

Mimi's transformers get a sliding window of a few steps so that tests which
stream a few seconds cross it. Unless told not to, a checkpoint ships a
word-level tokenizer (``<pad>`` at id 3, as in Moshi's), so text tokens become
transcript words and a persona can be primed.

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

NUM_CODEBOOKS = 4
TEXT_VOCAB = 48
AUDIO_VOCAB = 64
FRAME_SAMPLES = 1920
SAMPLE_RATE = 24_000
MIMI_SLIDING_WINDOW = 6

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3; <pad> is the text pad, as Moshi's
PAD = 3
WORDS = ("hello", "there", "how", "are", "you", "doing", "today", "friend")
PROMPT_WORDS = ("<system>", "be", "a", "kind", "pirate", "speak", "slowly")
ANSWER = "".join(" " + word for word in WORDS)  # the talking model's transcript
SPEECH_AMPLITUDE = 0.3


def tiny_mimi_config() -> dict[str, object]:
    """Mimi at 24 kHz, ratios [8, 6, 5, 4] and a stride-2 downsample: 1920 samples a frame."""
    return {
        "sampling_rate": SAMPLE_RATE,
        "upsampling_ratios": [8, 6, 5, 4],
        "hidden_size": 16,
        "num_filters": 4,
        "num_residual_layers": 1,
        "codebook_size": AUDIO_VOCAB,
        "codebook_dim": 8,
        "vector_quantization_hidden_dimension": 8,
        "num_quantizers": NUM_CODEBOOKS,
        "num_semantic_quantizers": 1,
        "upsample_groups": 16,
        "num_hidden_layers": 2,
        "intermediate_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "sliding_window": MIMI_SLIDING_WINDOW,
    }


def tiny_moshi(
    directory: Path, seed: int = 0, window: int = 3000, *, tokenizer: bool = True
) -> Path:
    """Build, randomise and save a tiny ``MoshiForConditionalGeneration`` (its Mimi
    inside); ``window``: its temporal transformer's sliding window, in frames;
    ``tokenizer``: save the word-level tokenizer beside it (the bench's
    throughput run reads no text, so it goes without)."""
    import torch
    from transformers import MoshiConfig, MoshiForConditionalGeneration

    config = MoshiConfig(
        vocab_size=TEXT_VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=64,
        num_codebooks=NUM_CODEBOOKS,
        max_position_embeddings=3000,
        sliding_window=window,
        audio_encoder_config=tiny_mimi_config(),
        depth_decoder_config={
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "ffn_dim": 64,
            "sliding_window": NUM_CODEBOOKS + 1,
            "max_position_embeddings": NUM_CODEBOOKS + 1,
        },
    )
    torch.manual_seed(seed)
    model = MoshiForConditionalGeneration(config)
    randomise_codebooks(model.audio_encoder, seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if tokenizer:
        save_tokenizer(directory)
    return directory


def randomise_codebooks(mimi: object, seed: int) -> None:
    """Give every Mimi codebook distinct random centroids (a fresh model has zeros)."""
    import torch
    from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

    generator = torch.Generator().manual_seed(seed + 1)
    for module in mimi.modules():  # type: ignore[attr-defined]
        if isinstance(module, MimiEuclideanCodebook):
            with torch.no_grad():
                module.embed_sum.copy_(torch.randn(module.embed_sum.shape, generator=generator))
                module.cluster_usage.fill_(1.0)
            module._embed = None


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


def float64_moshi(directory: Path, **config: Any) -> Any:
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
