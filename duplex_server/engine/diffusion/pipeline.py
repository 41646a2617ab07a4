"""The diffusers side of the diffusion backend: a pipeline loaded from a
local directory, run one job at a time on its own thread, a step at a time.

Only this module imports torch and diffusers (when ``--image-model`` or
``--video-model`` is given). Each step's ``callback_on_step_end`` reports
progress and is where an aborted job stops (stepping.py). Pixels leave as
``uint8`` arrays; same seed and job give the same pixels (the generator is
seeded on the CPU)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np

from duplex_server.engine.core import EngineRequest
from duplex_server.engine.diffusion.jobs import (
    DiffusionChunk,
    ImageJob,
    Images,
    PipelineInfo,
    Pixels,
    Video,
    VideoJob,
)
from duplex_server.engine.diffusion.stepping import Progress, StepThread

VIDEO_FPS = 8
# The largest side a pipeline is asked for, in multiples of its native size.
MAX_SIDE_FACTOR = 4
# Pipelines load one at a time: diffusers' lazy module is not safe to import
# from two threads at once (with --image-model and --video-model both given,
# the second thread's ``from diffusers import DiffusionPipeline`` failed with
# ImportError three times in three fresh processes).
_LOADING = threading.Lock()


class LoadedPipeline:
    """The pipeline and the variants an edit needs, built on the backend's thread."""

    def __init__(self, path: Path, video: bool) -> None:
        with _LOADING:
            import torch
            from diffusers import DiffusionPipeline

            self.torch = torch
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
            self.pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
            self.pipe.to(self.device)
            self.pipe.set_progress_bar_config(disable=True)
            self._img2img: Any = None
            self._inpaint: Any = None
            self.info = self._describe(path, video)

    def _describe(self, path: Path, video: bool) -> PipelineInfo:
        pipe = self.pipe
        scale = int(getattr(pipe, "vae_scale_factor", 8))
        sample = pipe.unet.config.sample_size if hasattr(pipe, "unet") else 64
        side = int(sample) * scale
        multiple = max(8, scale)  # the SD-family pipelines check multiples of 8
        return PipelineInfo(
            name=path.name,
            pipeline=type(pipe).__name__,
            video=video,
            default_size=(side, side),
            size_multiple=multiple,
            max_side=side * MAX_SIDE_FACTOR,
            edits=not video and self._edit_pipelines_exist(),
            negative_prompt="negative_prompt" in _parameters(pipe),
            max_frames=_max_frames(pipe) if video else 0,
            fps=VIDEO_FPS if video else 0,
        )

    def _edit_pipelines_exist(self) -> bool:
        try:
            self.img2img()
            self.inpaint()
        except ValueError:  # AutoPipeline has no edit variant of this class
            return False
        return True

    def img2img(self) -> Any:
        if self._img2img is None:
            from diffusers import AutoPipelineForImage2Image

            self._img2img = AutoPipelineForImage2Image.from_pipe(self.pipe)
            self._img2img.set_progress_bar_config(disable=True)
        return self._img2img

    def inpaint(self) -> Any:
        if self._inpaint is None:
            from diffusers import AutoPipelineForInpainting

            self._inpaint = AutoPipelineForInpainting.from_pipe(self.pipe)
            self._inpaint.set_progress_bar_config(disable=True)
        return self._inpaint

    def _common(self, job: ImageJob | VideoJob, progress: Progress) -> dict[str, Any]:
        def on_step(pipe: Any, index: int, timestep: Any, tensors: dict[str, Any]) -> Any:
            progress.step(index + 1, int(getattr(pipe, "num_timesteps", job.steps)))
            return tensors

        kwargs: dict[str, Any] = {
            "prompt": job.prompt,
            "num_inference_steps": job.steps,
            "generator": self.torch.Generator("cpu").manual_seed(job.seed),
            "output_type": "np",
            "callback_on_step_end": on_step,
            "width": job.width,
            "height": job.height,
        }
        if job.negative_prompt is not None:
            kwargs["negative_prompt"] = job.negative_prompt
        if job.guidance_scale is not None:
            kwargs["guidance_scale"] = job.guidance_scale
        return kwargs

    def images(self, job: ImageJob, progress: Progress) -> Images:
        from PIL import Image

        kwargs = self._common(job, progress)
        kwargs["num_images_per_prompt"] = job.n
        target = self.pipe
        if job.image is not None:
            size = (job.width, job.height)
            kwargs["image"] = Image.fromarray(job.image).convert("RGB").resize(size)
            target = self.img2img()
            del kwargs["width"], kwargs["height"]  # image-to-image keeps the source's size
            if job.mask is not None:
                kwargs.update(width=job.width, height=job.height)
                kwargs["mask_image"] = Image.fromarray(job.mask).convert("L").resize(size)
                target = self.inpaint()
        with self.torch.inference_mode():
            result = target(**kwargs)
        return Images([_to_uint8(image) for image in result.images])

    def video(self, job: VideoJob, progress: Progress) -> Video:
        kwargs = self._common(job, progress)
        kwargs["num_frames"] = job.frames
        with self.torch.inference_mode():
            result = self.pipe(**kwargs)
        return Video(_to_uint8(np.asarray(result.frames[0])), VIDEO_FPS)


def _to_uint8(pixels: Any) -> Pixels:
    return (np.clip(np.asarray(pixels), 0.0, 1.0) * 255).round().astype(np.uint8)


def _parameters(pipe: Any) -> set[str]:
    import inspect

    return set(inspect.signature(pipe.__call__).parameters)


def _max_frames(pipe: Any) -> int:
    """A motion module's longest sequence (AnimateDiff), else 16 frames."""
    return int(getattr(pipe.unet.config, "motion_max_seq_length", 0) or 16)


class DiffusersBackend:
    """Engine backend: loads on its thread at once; jobs wait for the load."""

    def __init__(self, path: Path, video: bool) -> None:
        self._thread = StepThread("diffusion-video" if video else "diffusion-image")
        self._loading = self._thread.call(LoadedPipeline, path, video)

    async def loaded(self) -> LoadedPipeline:
        """The pipeline, once loaded (its load error, raised, if it failed)."""
        return await asyncio.wrap_future(self._loading)

    @property
    def ready(self) -> bool:
        return self._loading.done() and self._loading.exception() is None

    async def generate(
        self, request: EngineRequest[ImageJob | VideoJob]
    ) -> AsyncIterator[DiffusionChunk]:
        loaded = await self.loaded()
        job = request.payload
        work: Callable[[Progress], Images | Video]
        if isinstance(job, ImageJob):
            work = functools.partial(loaded.images, job)
        else:
            work = functools.partial(loaded.video, job)
        steps: AsyncIterator[DiffusionChunk] = self._thread.run(work)
        async for chunk in steps:
            yield chunk

    def shutdown(self) -> None:
        self._thread.shutdown()
