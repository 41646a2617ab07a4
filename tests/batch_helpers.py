"""What the batch API tests share: a server with the cascade's speech
stages on each log backend, the openai SDK pointed at it, and reading audio
back with PyAV."""

from __future__ import annotations

import contextlib
import io
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import av
import openai

from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from tests.conftest import RunningServer, running_server


def store_spec(kind: str, tmp_path: Path, redis_url: str | None) -> tuple[str, dict]:
    if kind == "memory":
        return "memory", {"blob_dir": str(tmp_path / "blobs")}
    if kind == "sqlite":
        return f"sqlite:{tmp_path / 'sessions.db'}", {}
    assert redis_url is not None
    return redis_url, {
        "redis_prefix": f"t{uuid.uuid4().hex[:12]}",
        "blob_dir": str(tmp_path / "blobs"),
    }


@contextlib.asynccontextmanager
async def batch_server(store: str, **overrides: object) -> AsyncIterator[RunningServer]:
    overrides.setdefault("model", "cascade")
    overrides.setdefault("asr", "pocketsphinx")
    config = ServerConfig(port=free_port(), store=store, **overrides)  # type: ignore[arg-type]
    async with running_server(config) as running:
        yield running


def client(server: RunningServer, api_key: str = "unused", **kwargs: object) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=api_key, base_url=f"{server.http_url}/v1", max_retries=0, **kwargs
    )


def decoded(data: bytes) -> tuple[int, int, str]:
    """(samples, sample rate, codec) of the first audio stream PyAV finds."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(audio=0))
        return samples, stream.rate, stream.codec_context.name


def blob_files(server: RunningServer) -> list[Path]:
    root = server.app.state.batch.blobs.root  # type: ignore[attr-defined]
    return sorted(p for p in root.rglob("*") if p.is_file())
