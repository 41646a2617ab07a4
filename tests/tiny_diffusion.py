"""Tiny diffusers pipelines built here with ``save_pretrained``: the real
classes (a UNet, a CLIP text encoder with its own BPE tokenizer, a VAE, a
scheduler) at a few thousand parameters, loaded by the server through the
same ``--image-model`` / ``--video-model`` path a real checkpoint takes.
No downloads: every file is written here.

A tiny image pipeline makes 16x16 pictures by default and sizes that are
multiples of 8 (its VAE halves twice, its UNet once more); the video one
makes 16x16 frames."""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path
from typing import Any

IMAGE_SAMPLE_SIZE = 4  # latent side: 16 px through the VAE's two halvings


def _tokenizer() -> Any:
    """A CLIP tokenizer over single characters (no merges): every prompt tokenizes."""
    from transformers import CLIPTokenizer

    letters = string.ascii_letters + string.digits + string.punctuation
    tokens = [*letters, *(f"{c}</w>" for c in letters), "<|startoftext|>", "<|endoftext|>"]
    with tempfile.TemporaryDirectory() as scratch:
        vocab, merges = Path(scratch) / "vocab.json", Path(scratch) / "merges.txt"
        vocab.write_text(json.dumps({token: index for index, token in enumerate(tokens)}))
        merges.write_text("#version: 0.2\n")
        return CLIPTokenizer(str(vocab), str(merges), model_max_length=16)


def _text_encoder(vocab_size: int) -> Any:
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    config = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
        projection_dim=8,
        bos_token_id=vocab_size - 2,
        eos_token_id=vocab_size - 1,
        pad_token_id=vocab_size - 1,
    )
    return CLIPTextModel(config)


def _vae() -> Any:
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(
        block_out_channels=(8, 8, 8),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        latent_channels=4,
        norm_num_groups=2,
        sample_size=16,
    )


def _unet(cls: Any = None) -> Any:
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return (cls or UNet2DConditionModel)(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=IMAGE_SAMPLE_SIZE,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=8,
        attention_head_dim=2,
        norm_num_groups=2,
    )


def _scheduler() -> Any:
    from diffusers import DDIMScheduler

    return DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )


def tiny_image_pipeline(directory: Path) -> Path:
    """A StableDiffusionPipeline, saved to ``directory``."""
    from diffusers import StableDiffusionPipeline

    tokenizer = _tokenizer()
    pipe = StableDiffusionPipeline(
        vae=_vae(),
        text_encoder=_text_encoder(len(tokenizer)),
        tokenizer=tokenizer,
        unet=_unet(),
        scheduler=_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(directory)
    return directory


def tiny_video_pipeline(directory: Path) -> Path:
    """An AnimateDiffPipeline (a UNet with motion modules), saved to ``directory``."""
    import torch
    from diffusers import AnimateDiffPipeline, MotionAdapter

    tokenizer = _tokenizer()
    torch.manual_seed(0)
    adapter = MotionAdapter(
        block_out_channels=(8, 16),
        motion_layers_per_block=1,
        motion_norm_num_groups=2,
        motion_num_attention_heads=2,
        motion_max_seq_length=32,
    )
    pipe = AnimateDiffPipeline(
        vae=_vae(),
        text_encoder=_text_encoder(len(tokenizer)),
        tokenizer=tokenizer,
        unet=_unet(),
        motion_adapter=adapter,
        scheduler=_scheduler(),
    )
    pipe.save_pretrained(directory)
    return directory
