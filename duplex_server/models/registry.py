"""Model names the CLI accepts, and how each is built."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from duplex_server.engine import EngineCore
from duplex_server.engine.audio.remote_speech import RemoteSpeechOptions
from duplex_server.engine.llm import LLMOptions, RemoteOptions
from duplex_server.models.echo import EchoBackend, EchoModel
from duplex_server.sessions.core.model_port import ModelPort

MODEL_NAMES = ("echo", "cascade", "scripted")
MOSHI_PREFIX = "moshi:"  # moshi:PATH, a Moshi-architecture checkpoint directory


class ModelChoices(tuple[str, ...]):
    """The names ``--model`` lists, and also takes ``moshi:PATH``."""

    def __contains__(self, value: object) -> bool:
        if isinstance(value, str) and value.startswith(MOSHI_PREFIX):
            return len(value) > len(MOSHI_PREFIX)
        return super().__contains__(value)


MODEL_CHOICES = ModelChoices((*MODEL_NAMES, f"{MOSHI_PREFIX}PATH"))


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
    llm: LLMOptions | RemoteOptions | None = None,
    asr_remote: RemoteSpeechOptions | None = None,
    tts_remote: RemoteSpeechOptions | None = None,
    device: str = "cpu",
    dtype: str = "auto",
    moshi_rows: int = 8,
    moshi_voices: str | None = None,
    moshi_step: str = "eager",
) -> ModelPort:
    """Cascade options: ``asr`` / ``tts`` name its stages (``whisper:PATH``,
    ``vits:PATH`` load local checkpoints); ``asr_phrases`` make PocketSphinx
    listen for those phrases only; ``llm`` answers with a chat model;
    ``asr_remote`` / ``tts_remote`` put its recogniser / voice on another
    server (``--asr-url``, ``--tts-url``).
    ``moshi:PATH`` runs on ``device`` in ``dtype``, ``moshi_rows`` sessions
    in its batched step computed by ``moshi_step`` ('eager' or 'fast'), with
    the voice prompts of ``moshi_voices`` (a directory)."""
    if moshi_voices is not None and not name.startswith(MOSHI_PREFIX):
        raise ValueError(f"--voices primes a moshi:PATH model; --model {name} takes none")
    if llm is not None and name != "cascade":
        raise ValueError(f"--llm answers in the cascade; --model {name} has no responder")
    for option, remote in (("--asr-url", asr_remote), ("--tts-url", tts_remote)):
        if remote is not None and name != "cascade":
            raise ValueError(f"{option} is the cascade's; --model {name} has no such stage")
    if name.startswith(MOSHI_PREFIX) and name != MOSHI_PREFIX:
        # Imported here: its engine loads torch and transformers.
        from duplex_server.models.moshi import build_moshi

        path = name[len(MOSHI_PREFIX) :]
        return build_moshi(
            path, device=device, dtype=dtype, rows=moshi_rows, voices=moshi_voices, step=moshi_step
        )
    if name == "echo":
        return EchoModel(EngineCore(EchoBackend(), max_concurrency=max_concurrency))
    if name == "cascade":
        # Imported here: its stages load onnxruntime, PocketSphinx and eSpeak.
        from duplex_server.models.cascade import build_cascade

        return build_cascade(
            asr_phrases,
            max_concurrency=max_concurrency,
            asr=asr,
            tts=tts,
            llm=llm,
            asr_remote=asr_remote,
            tts_remote=tts_remote,
        )
    if name == "scripted":
        from duplex_server.models.scripted import ScriptedModel

        return ScriptedModel()
    raise ValueError(f"unknown model {name!r}; available: {', '.join(MODEL_NAMES)}")
