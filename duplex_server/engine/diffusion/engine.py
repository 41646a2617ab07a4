"""The diffusion engine: one loaded pipeline behind the engine core, its
jobs at batch priority, one at a time (a denoising loop already uses every
core; two at once would only interleave them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from duplex_server.engine.core import EngineCore, EngineRequest, Priority
from duplex_server.engine.diffusion.jobs import DiffusionChunk, ImageJob, PipelineInfo, VideoJob

if TYPE_CHECKING:
    from duplex_server.engine.diffusion.pipeline import DiffusersBackend


class PipelineLoadError(RuntimeError):
    """The pipeline directory did not load (its reason in the message)."""


class DiffusionEngine:
    def __init__(self, backend: DiffusersBackend, name: str, path: str) -> None:
        self.backend = backend
        self.path = path
        self.core: EngineCore[ImageJob | VideoJob, DiffusionChunk] = EngineCore(
            backend, max_concurrency=1, name=name
        )

    @property
    def ready(self) -> bool:
        return self.backend.ready

    async def info(self) -> PipelineInfo:
        """What the pipeline can make (waits for it to load); PipelineLoadError
        if it did not load."""
        try:
            loaded = await self.backend.loaded()
        except Exception as exc:  # whatever diffusers raised, reported with its reason
            raise PipelineLoadError(f"{self.path}: {type(exc).__name__}: {exc}") from exc
        return loaded.info

    def submit(
        self, request_id: str, session_id: str, job: ImageJob | VideoJob
    ) -> AsyncIterator[DiffusionChunk]:
        """The job's steps, then its ``Images`` or ``Video``."""
        return self.core.submit(
            EngineRequest(
                request_id=request_id,
                session_id=session_id,
                response_id=request_id,
                epoch=0,
                payload=job,
                priority=Priority.BATCH,
            )
        )

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)

    def shutdown(self) -> None:
        self.backend.shutdown()


def load_diffusion(path: str, video: bool) -> DiffusionEngine:
    """``--image-model PATH`` / ``--video-model PATH``: a diffusers pipeline
    directory (its ``model_index.json``). Loading starts on the backend's
    thread; raises ValueError at once when the directory is no pipeline."""
    directory = Path(path)
    option = "--video-model" if video else "--image-model"
    if not (directory / "model_index.json").is_file():
        raise ValueError(f"{option} {path}: not a diffusers pipeline (no model_index.json)")
    from duplex_server.engine.diffusion.pipeline import DiffusersBackend

    kind = "video" if video else "image"
    return DiffusionEngine(DiffusersBackend(directory, video), f"diffusion-{kind}", path)
