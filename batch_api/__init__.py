"""The batch API: OpenAI-compatible generation routes as one-shot sessions
on the session log (DESIGN.md, "batch_api").

:class:`BatchApi` is the one thing the app wires: its ``routes``, and
``start`` / ``shutdown`` in the app's lifespan. A route module (``speech``,
``transcriptions``, ...) gives a :class:`~duplex_server.jobs.run.JobKind`
(how to run a job from its stored request) and a Starlette endpoint that
validates the request, submits it to ``app.state.batch.runner`` and answers
from the run (:mod:`batch_api.http`).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from starlette.routing import BaseRoute, Route, WebSocketRoute

from batch_api import speech, speech_stream, transcriptions
from batch_api.images import ImagesApi
from batch_api.videos import VideosApi
from duplex_server.config import ServerConfig
from duplex_server.jobs.blobs import BlobStore
from duplex_server.jobs.runner import JobRunner, RunnerSettings
from duplex_server.models.batch_audio import BatchAudio, batch_audio
from duplex_server.sessions.core.model_port import ModelPort
from duplex_server.sessions.log.store import SessionLog


def default_blob_dir(store: str) -> Path:
    """Beside the SQLite file (``sessions.db`` -> ``sessions.db.blobs/``);
    ``./data/blobs`` for Redis (every replica must see the same folder);
    a temporary folder for the memory store, which keeps nothing either."""
    if store.startswith("sqlite:"):
        return Path(store.removeprefix("sqlite:") + ".blobs")
    if store == "memory":
        return Path(tempfile.mkdtemp(prefix="duplex-blobs-"))
    return Path("data/blobs")


@dataclass
class BatchApi:
    runner: JobRunner
    audio: BatchAudio
    blobs: BlobStore
    temporary_blobs: bool = False  # a folder of our own (memory store): removed at shutdown
    images: ImagesApi | None = None
    videos: VideosApi | None = None

    @classmethod
    def build(cls, config: ServerConfig, log: SessionLog, model: ModelPort) -> BatchApi:
        temporary = config.blob_dir is None and config.store == "memory"
        # As durable as the log: a blob the log may lose need not reach the disk.
        fsync = log.durable and config.durability != "os-buffered"
        blobs = BlobStore(config.blob_dir or default_blob_dir(config.store), fsync=fsync)
        runner = JobRunner(
            log,
            blobs,
            RunnerSettings(
                owner=config.replica_id,
                retention_s=config.batch_retention_s,
                max_jobs=config.batch_max_jobs,
                max_jobs_per_key=config.batch_max_jobs_per_key,
                sweep_interval_s=min(60.0, max(1.0, config.batch_retention_s / 4)),
                lease_renew_s=config.lease_ttl_ms / 3000,
                cpu_workers=config.batch_cpu_workers,
            ),
        )
        audio = batch_audio(model)
        runner.register(speech.kind(audio))
        runner.register(transcriptions.kind(audio))
        images, videos = ImagesApi.build(config, runner), VideosApi.build(config, runner)
        return cls(runner, audio, blobs, temporary, images, videos)

    @property
    def routes(self) -> list[BaseRoute]:
        return [
            Route(speech.ROUTE, speech.endpoint, methods=["POST"]),
            Route(transcriptions.ROUTE, transcriptions.endpoint, methods=["POST"]),
            WebSocketRoute(speech_stream.ROUTE, speech_stream.speech_stream_endpoint),
            *(self.images.routes if self.images else []),
            *(self.videos.routes if self.videos else []),
        ]

    async def start(self) -> None:
        """Finish the jobs a previous process left, then keep retention."""
        await self.runner.recover_or_defer()
        self.runner.start()

    async def shutdown(self) -> None:
        await self.runner.shutdown()
        for media in (self.images, self.videos):
            if media is not None:
                media.shutdown()
        if self.temporary_blobs:
            shutil.rmtree(self.blobs.root, ignore_errors=True)
