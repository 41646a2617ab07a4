"""Tiny transformers checkpoints built here with ``save_pretrained``: they run
through the same loading and inference code as real Whisper / VITS ones."""

from __future__ import annotations

import json
from pathlib import Path

LETTERS = list("abcdefghijklmnopqrstuvwxyz .,!?'")


def tiny_whisper(directory: Path) -> Path:
    import torch
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )

    directory.mkdir(parents=True, exist_ok=True)
    special = ["<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>"]
    vocab = {token: index for index, token in enumerate([*LETTERS, "Ġ", *special])}
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    end = "<|endoftext|>"
    tokenizer = WhisperTokenizer(
        str(directory / "vocab.json"),
        str(directory / "merges.txt"),
        unk_token=end,
        bos_token=end,
        eos_token=end,
        pad_token=end,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": special[1:]})
    WhisperProcessor(
        feature_extractor=WhisperFeatureExtractor(feature_size=16), tokenizer=tokenizer
    ).save_pretrained(directory)
    config = WhisperConfig(
        vocab_size=len(vocab),
        num_mel_bins=16,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_target_positions=128,
        decoder_start_token_id=vocab["<|startoftranscript|>"],
        eos_token_id=vocab[end],
        pad_token_id=vocab[end],
        bos_token_id=vocab[end],
    )
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    generation = model.generation_config
    generation.decoder_start_token_id = config.decoder_start_token_id
    generation.eos_token_id = generation.pad_token_id = vocab[end]
    generation.no_timestamps_token_id = vocab["<|notimestamps|>"]
    generation.forced_decoder_ids = None
    model.save_pretrained(directory)
    return directory


def tiny_vits(directory: Path) -> Path:
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {token: index for index, token in enumerate(["<pad>", *LETTERS])}
    (directory / "vocab.json").write_text(json.dumps(vocab))
    VitsTokenizer(
        str(directory / "vocab.json"),
        pad_token="<pad>",
        unk_token="<pad>",
        language=None,
        add_blank=True,
        normalize=True,
        phonemize=False,
    ).save_pretrained(directory)
    config = VitsConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        ffn_dim=32,
        flow_size=16,
        spectrogram_bins=33,
        upsample_initial_channel=16,
        upsample_rates=[8, 8, 4],
        upsample_kernel_sizes=[16, 16, 8],
        resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1, 3]],
        prior_encoder_num_flows=1,
        prior_encoder_num_wavenet_layers=1,
        duration_predictor_num_flows=1,
        duration_predictor_filter_channels=16,
        posterior_encoder_num_wavenet_layers=1,
        depth_separable_num_layers=1,
        sampling_rate=16_000,
    )
    torch.manual_seed(0)
    VitsModel(config).save_pretrained(directory)
    return directory
