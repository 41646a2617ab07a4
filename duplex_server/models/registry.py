"""Model names the CLI accepts, and how each is built."""

from __future__ import annotations

from duplex_server.engine import EngineCore
from duplex_server.models.echo import EchoBackend, EchoModel
from duplex_server.sessions.model_port import ModelPort

MODEL_NAMES = ("echo",)


def build_model(name: str, *, max_concurrency: int = 256) -> ModelPort:
    if name == "echo":
        return EchoModel(EngineCore(EchoBackend(), max_concurrency=max_concurrency))
    raise ValueError(f"unknown model {name!r}; available: {', '.join(MODEL_NAMES)}")
