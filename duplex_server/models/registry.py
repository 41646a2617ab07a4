"""Model names the CLI accepts, and how each is built."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from duplex_server.engine import EngineCore
from duplex_server.engine.llm import LLMOptions
from duplex_server.models.echo import EchoBackend, EchoModel
from duplex_server.sessions.core.model_port import ModelPort

MODEL_NAMES = ("echo", "cascade", "scripted")


@runtime_checkable
class _Closable(Protocol):
    def close(self) -> None: ...


def close_model(model: ModelPort) -> None:
    """Stop the threads a model runs of its own (the cascade's LLM decode
    thread) at server shutdown; blocking, so called off the event loop."""
    if isinstance(model, _Closable):
        model.close()


def build_model(
    name: str,
    *,
    max_concurrency: int = 256,
    asr_phrases: list[str] | None = None,
    asr: str = "auto",
    tts: str = "espeak",
    llm: LLMOptions | None = None,
) -> ModelPort:
    """Cascade options: ``asr`` / ``tts`` name its stages (``whisper:PATH``,
    ``vits:PATH`` load local checkpoints); ``asr_phrases`` make PocketSphinx
    listen for those phrases only; ``llm`` answers with a chat model."""
    if llm is not None and name != "cascade":
        raise ValueError(f"--llm answers in the cascade; --model {name} has no responder")
    if name == "echo":
        return EchoModel(EngineCore(EchoBackend(), max_concurrency=max_concurrency))
    if name == "cascade":
        # Imported here: its stages load onnxruntime, PocketSphinx and eSpeak.
        from duplex_server.models.cascade import build_cascade

        return build_cascade(
            asr_phrases, max_concurrency=max_concurrency, asr=asr, tts=tts, llm=llm
        )
    if name == "scripted":
        from duplex_server.models.scripted import ScriptedModel

        return ScriptedModel()
    raise ValueError(f"unknown model {name!r}; available: {', '.join(MODEL_NAMES)}")
