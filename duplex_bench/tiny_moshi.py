"""A tiny random Moshi-architecture checkpoint built here with ``save_pretrained``
(the one ``bench duplex-model`` serves without ``--model``; ``tests/tiny_moshi``
builds on it, adding a tokenizer and a hand-set talking model).

It has the real structure (a temporal transformer over text + user and model
audio codes, a depth decoder that emits a frame's codebooks one by one, and a
Mimi codec at 24 kHz with the standard up-sampling ratios, so a frame is 1920
samples) at toy widths, and loads through the same code path as a converted
Moshi or PersonaPlex checkpoint. Two details make a random one usable:

- a random ``MimiModel`` starts with all-zero codebooks (every frame would
  quantise to code 0), so the codebooks are randomised before saving;
- the depth decoder's ``sliding_window`` must be at least its number of
  codebooks, or its cache forgets the frame's first codes.

Mimi's transformers get a sliding window of a few steps so that tests which
stream a few seconds cross it.
"""

from __future__ import annotations

from pathlib import Path

NUM_CODEBOOKS = 4
TEXT_VOCAB = 48
AUDIO_VOCAB = 64
FRAME_SAMPLES = 1920
SAMPLE_RATE = 24_000
MIMI_SLIDING_WINDOW = 6


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


def tiny_moshi(directory: Path, seed: int = 0, window: int = 3000) -> Path:
    """Build, randomise and save a tiny ``MoshiForConditionalGeneration`` (its Mimi
    inside); ``window``: its temporal transformer's sliding window, in frames."""
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
