"""Random-weight Stable Diffusion pipelines for ``bench batch``, and the
same pipeline called directly in the bench process.

The bench needs an image pipeline the server can load with ``--image-model``
and that the bench can call itself, without downloads. This builds the real
diffusers classes (UNet, CLIP text encoder with a character-level BPE
tokenizer, VAE, DDIM scheduler) at a named shape and saves them with
``save_pretrained``: ``tiny`` is the test suite's few-thousand-parameter
pipeline (16 px, a step costs less than the HTTP request around it),
``small`` is SD's layout (VAE factor 8, cross-attention UNet) narrowed to
128 px, where a 4-step job takes about a third of a second on two quiet CPU
cores: long enough that the route's fixed cost (HTTP, the job's records,
PNG) is a few percent of it, not most of it. ``sd15`` is Stable Diffusion
1.5's UNet and VAE at full size (512 px, 860 M UNet parameters) with a text
encoder of its width and depth: a GPU's job, a real one's cost per step.

torch, transformers and diffusers are imported inside the functions: the
bench imports this module only when it benchmarks images."""

from __future__ import annotations

import asyncio
import json
import string
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Shape:
    text_hidden: int
    text_layers: int
    max_tokens: int
    vae_channels: tuple[int, ...]
    unet_channels: tuple[int, ...]
    unet_down: tuple[str, ...]
    unet_up: tuple[str, ...]
    groups: int
    head_dim: int
    sample_size: int  # latent side; pixels = sample_size * 2 ** (len(vae_channels) - 1)
    layers_per_block: int = 1  # of the UNet and the VAE


SHAPES = {
    "sd15": Shape(
        text_hidden=768,
        text_layers=12,
        max_tokens=77,
        vae_channels=(128, 256, 512, 512),
        unet_channels=(320, 640, 1280, 1280),
        unet_down=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        unet_up=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        groups=32,
        head_dim=8,
        sample_size=64,
        layers_per_block=2,
    ),
    "tiny": Shape(
        text_hidden=8,
        text_layers=1,
        max_tokens=16,
        vae_channels=(8, 8, 8),
        unet_channels=(8, 16),
        unet_down=("CrossAttnDownBlock2D", "DownBlock2D"),
        unet_up=("UpBlock2D", "CrossAttnUpBlock2D"),
        groups=2,
        head_dim=2,
        sample_size=4,
    ),
    "small": Shape(
        text_hidden=64,
        text_layers=2,
        max_tokens=77,
        vae_channels=(32, 64, 64, 64),
        unet_channels=(64, 128, 128),
        unet_down=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        unet_up=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        groups=32,
        head_dim=8,
        sample_size=16,
    ),
}


def default_side(shape: str) -> int:
    """The pixel side a shape paints natively (what ``size=auto`` gives)."""
    s = SHAPES[shape]
    return s.sample_size * 2 ** (len(s.vae_channels) - 1)


def _tokenizer(max_tokens: int) -> Any:
    """A CLIP tokenizer over single characters (no merges): every prompt tokenizes."""
    from transformers import CLIPTokenizer

    letters = string.ascii_letters + string.digits + string.punctuation
    tokens = [*letters, *(f"{c}</w>" for c in letters), "<|startoftext|>", "<|endoftext|>"]
    with tempfile.TemporaryDirectory() as scratch:
        vocab, merges = Path(scratch) / "vocab.json", Path(scratch) / "merges.txt"
        vocab.write_text(json.dumps({token: index for index, token in enumerate(tokens)}))
        merges.write_text("#version: 0.2\n")
        return CLIPTokenizer(str(vocab), str(merges), model_max_length=max_tokens)


def build(shape_name: str, directory: Path) -> Path:
    """A random-weight StableDiffusionPipeline of ``shape_name``, saved to ``directory``."""
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    shape = SHAPES[shape_name]
    torch.manual_seed(0)
    tokenizer = _tokenizer(shape.max_tokens)
    vocab = len(tokenizer)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=vocab,
            hidden_size=shape.text_hidden,
            intermediate_size=shape.text_hidden * 2,
            num_hidden_layers=shape.text_layers,
            num_attention_heads=2,
            max_position_embeddings=shape.max_tokens,
            projection_dim=shape.text_hidden,
            bos_token_id=vocab - 2,
            eos_token_id=vocab - 1,
            pad_token_id=vocab - 1,
        )
    )
    levels = len(shape.vae_channels)
    vae = AutoencoderKL(
        block_out_channels=shape.vae_channels,
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * levels,
        up_block_types=("UpDecoderBlock2D",) * levels,
        latent_channels=4,
        layers_per_block=shape.layers_per_block,
        norm_num_groups=min(shape.groups, min(shape.vae_channels)),
        sample_size=default_side(shape_name),
    )
    unet = UNet2DConditionModel(
        block_out_channels=shape.unet_channels,
        layers_per_block=shape.layers_per_block,
        sample_size=shape.sample_size,
        in_channels=4,
        out_channels=4,
        down_block_types=shape.unet_down,
        up_block_types=shape.unet_up,
        cross_attention_dim=shape.text_hidden,
        attention_head_dim=shape.head_dim,
        norm_num_groups=shape.groups,
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    pipeline: Any = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(directory)
    return directory


@dataclass(frozen=True)
class ImageAsk:
    """One job, the same on both sides of the comparison."""

    prompt: str
    width: int
    height: int
    steps: int
    n: int
    seed: int


class DirectPipeline:
    """The pipeline loaded and called the way a diffusers user would, in
    this process: the baseline the server's route is measured against. It
    loads and calls it as the server's backend does (``local_files_only``,
    a CPU generator seeded per job, ``output_type='np'``), so the same job
    paints the same pixels on both sides."""

    def __init__(self, path: str) -> None:
        import torch
        from diffusers import DiffusionPipeline

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
        self.pipe.to(self.device)
        self.pipe.set_progress_bar_config(disable=True)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="direct-pipeline")

    @property
    def native_side(self) -> int:
        """The side in pixels the pipeline paints by default."""
        return int(self.pipe.unet.config.sample_size) * int(self.pipe.vae_scale_factor)

    async def painted(self, ask: ImageAsk) -> tuple[float, list[npt.NDArray[np.uint8]]]:
        """``paint`` on the pipeline's one thread, as the server's engine
        runs it. OpenMP keeps a team of threads per calling thread: calls
        spread over a pool's threads leave one team spinning while the next
        works, which on two cores cost back-to-back calls a third of their
        speed."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.paint, ask)

    def paint(self, ask: ImageAsk) -> tuple[float, list[npt.NDArray[np.uint8]]]:
        """Seconds the call took, and its pictures as ``uint8`` RGB."""
        began = time.perf_counter()
        with self.torch.inference_mode():
            result = self.pipe(
                prompt=ask.prompt,
                num_inference_steps=ask.steps,
                width=ask.width,
                height=ask.height,
                num_images_per_prompt=ask.n,
                generator=self.torch.Generator("cpu").manual_seed(ask.seed),
                output_type="np",
            )
        if self.device != "cpu":
            self.torch.cuda.synchronize()
        seconds = time.perf_counter() - began
        pixels = [
            (np.clip(np.asarray(image), 0.0, 1.0) * 255).round().astype(np.uint8)
            for image in result.images
        ]
        return seconds, pixels
