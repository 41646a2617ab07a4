"""What the diffusion backend is asked for and what it yields, without
torch: the batch routes build jobs and read results through these.

Pictures travel as RGB ``uint8`` arrays (height x width x 3; a video as
frames x height x width x 3): encoding them (PNG, MP4) is the caller's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Pixels = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class ImageJob:
    prompt: str
    width: int
    height: int
    steps: int
    seed: int
    n: int = 1
    negative_prompt: str | None = None
    guidance_scale: float | None = None  # None: the pipeline's default
    image: Pixels | None = None  # an edit's source picture
    mask: Pixels | None = None  # height x width, white where the edit paints


@dataclass(frozen=True)
class VideoJob:
    prompt: str
    width: int
    height: int
    frames: int
    steps: int
    seed: int
    negative_prompt: str | None = None
    guidance_scale: float | None = None


@dataclass(frozen=True)
class Step:
    """Denoising step ``done`` of ``total`` has finished."""

    done: int
    total: int


@dataclass(frozen=True)
class Images:
    images: list[Pixels]


@dataclass(frozen=True)
class Video:
    frames: Pixels
    fps: int


DiffusionChunk = Step | Images | Video


@dataclass(frozen=True)
class PipelineInfo:
    """What a loaded pipeline can make: the routes refuse anything else
    before it is queued."""

    name: str  # the checkpoint directory's name: the model id clients see
    pipeline: str  # the diffusers class
    video: bool
    default_size: tuple[int, int]  # width, height
    size_multiple: int
    max_side: int
    edits: bool  # takes a source image (and a mask)
    negative_prompt: bool
    max_frames: int = 0
    fps: int = 0

    def size_problem(self, width: int, height: int) -> str | None:
        """Why ``width`` x ``height`` cannot be made, or None."""
        for side in (width, height):
            if side <= 0 or side > self.max_side:
                return f"sides must be between {self.size_multiple} and {self.max_side} pixels"
            if side % self.size_multiple:
                return f"sides must be multiples of {self.size_multiple} pixels"
        return None
