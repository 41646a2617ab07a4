"""The diffusion backend of the engine core: diffusers pipelines for images
and video, loaded from local directories, stepped on their own thread at
batch priority. torch and diffusers are imported only by ``pipeline``,
when a pipeline is loaded."""

from duplex_server.engine.diffusion.engine import DiffusionEngine, PipelineLoadError, load_diffusion
from duplex_server.engine.diffusion.jobs import (
    DiffusionChunk,
    ImageJob,
    Images,
    PipelineInfo,
    Step,
    Video,
    VideoJob,
)

__all__ = [
    "DiffusionChunk",
    "DiffusionEngine",
    "ImageJob",
    "Images",
    "PipelineInfo",
    "PipelineLoadError",
    "Step",
    "Video",
    "VideoJob",
    "load_diffusion",
]
