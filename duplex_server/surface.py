"""The server's public surface for tools: the one module ``duplex_bench``
(benchmarks, load generators, fuzzers, chaos drivers) and other tools outside
the product import from ``duplex_server``.

Why it exists: a tool that reached into ``sessions.core.records``,
``sessions.log.redis_store`` or ``sessions.runtime.manager`` would break, or
pin the layout, whenever the server moves a piece inside itself. Here the
names a tool may use have one stable face; an internal move touches this file
and nothing in the bench. An import-linter contract in ``pyproject.toml``
("the bench sees the server only through its surface") refuses a direct
import of anything else in ``duplex_server`` from ``duplex_bench``. A tool
that needs a name not listed here adds it here, not an import of the module
that holds it.

Importing this module stays light: the session core, the log backends (the
Redis client library included), the session manager, the model registry,
metrics helpers, audio resampling and the engine core's request types; no
torch, transformers, vLLM, diffusers, PyAV, eSpeak NG or PocketSphinx.

The sanctioned heavy entry points are loaded lazily, on first access of their
name (``from duplex_server.surface import load_moshi`` inside the function
that needs it imports the backend then, not before):

- ``TransformersBackend`` (``engine.llm.transformers_backend``: torch, transformers)
- ``engine_arguments``, ``private_environment`` (``engine.llm.vllm_backend``)
- ``load_moshi`` (``engine.duplex.service``), ``make_stepper``
  (``engine.duplex.fast_step``), ``measure`` (``engine.duplex.bench_step``),
  ``check_moshi_checkpoint`` (``engine.duplex.checkpoint``): the native
  duplex model (torch, transformers)
- ``Espeak`` (``engine.audio.espeak``), ``Sphinx`` (``engine.audio.sphinx``):
  the embedded TTS and ASR (native libraries)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from duplex_server.audio import resample_pcm16
from duplex_server.audio.containers import decode as decode_audio
from duplex_server.audio.convert import decode_to_pcm16, encode_from_pcm16
from duplex_server.engine.core import EngineCore, EngineRequest
from duplex_server.engine.llm import ChatPayload, LLMOptions
from duplex_server.engine.llm.chat_template import render_prompt
from duplex_server.jobs.blobs import BlobStore
from duplex_server.metrics import histogram_quantile, parse_histogram, sample_value
from duplex_server.models import build_model
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import (
    MAX_VIDEO_FRAME_BYTES,
    MAX_VIDEO_FRAMES,
    ModelFacts,
    audio_append,
    audio_commit,
)
from duplex_server.sessions.core.model_port import ModelChunk
from duplex_server.sessions.core.records import AudioBody, LeaseBody, OutBody, Record, RecordLine
from duplex_server.sessions.core.responses import emit_chunk, finish_response
from duplex_server.sessions.core.snapshot import session_object
from duplex_server.sessions.core.state import Response, fold, initial_state
from duplex_server.sessions.core.turns import BARGE_IN_MS
from duplex_server.sessions.log.redis_store import REDIS_SCHEMES, RedisLog
from duplex_server.sessions.log.redis_store import connect as connect_redis
from duplex_server.sessions.log.sqlite_store import SqliteLog, SqliteReader
from duplex_server.sessions.log.store import StorageUnavailable
from duplex_server.sessions.log.tokens import hash_token, new_session_id
from duplex_server.sessions.runtime.actor_settings import ActorSettings
from duplex_server.sessions.runtime.manager import ManagerSettings, SessionManager

if TYPE_CHECKING:
    from duplex_server.engine.audio.espeak import Espeak
    from duplex_server.engine.audio.sphinx import Sphinx
    from duplex_server.engine.duplex.bench_step import measure
    from duplex_server.engine.duplex.checkpoint import check_moshi_checkpoint
    from duplex_server.engine.duplex.fast_step import make_stepper
    from duplex_server.engine.duplex.service import load_moshi
    from duplex_server.engine.llm.transformers_backend import TransformersBackend
    from duplex_server.engine.llm.vllm_backend import engine_arguments, private_environment

# name -> the module that holds it, imported on first access (PEP 562)
_HEAVY: dict[str, str] = {
    "TransformersBackend": "duplex_server.engine.llm.transformers_backend",
    "engine_arguments": "duplex_server.engine.llm.vllm_backend",
    "private_environment": "duplex_server.engine.llm.vllm_backend",
    "load_moshi": "duplex_server.engine.duplex.service",
    "make_stepper": "duplex_server.engine.duplex.fast_step",
    "measure": "duplex_server.engine.duplex.bench_step",
    "check_moshi_checkpoint": "duplex_server.engine.duplex.checkpoint",
    "Espeak": "duplex_server.engine.audio.espeak",
    "Sphinx": "duplex_server.engine.audio.sphinx",
}


def __getattr__(name: str) -> Any:
    module = _HEAVY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    # the session log: records and their bodies, the pure fold
    "AudioBody",
    "LeaseBody",
    "OutBody",
    "Record",
    "RecordLine",
    "Response",
    "fold",
    "initial_state",
    "session_object",
    # the session core's commands, batches and response projection
    "Batch",
    "ModelFacts",
    "MAX_VIDEO_FRAMES",
    "MAX_VIDEO_FRAME_BYTES",
    "BARGE_IN_MS",
    "ModelChunk",
    "audio_append",
    "audio_commit",
    "emit_chunk",
    "finish_response",
    # the log backends and resume tokens
    "REDIS_SCHEMES",
    "BlobStore",
    "RedisLog",
    "SqliteLog",
    "SqliteReader",
    "StorageUnavailable",
    "connect_redis",
    "hash_token",
    "new_session_id",
    # the runtime
    "ActorSettings",
    "ManagerSettings",
    "SessionManager",
    # the model registry
    "build_model",
    # metrics text helpers (a scraped /metrics page)
    "histogram_quantile",
    "parse_histogram",
    "sample_value",
    # audio
    "decode_audio",
    "resample_pcm16",
    "decode_to_pcm16",
    "encode_from_pcm16",
    # the engine core and the LLM engine's light types
    "ChatPayload",
    "EngineCore",
    "EngineRequest",
    "LLMOptions",
    "render_prompt",
    # the sanctioned heavy entry points, loaded lazily (see above)
    "Espeak",
    "Sphinx",
    "TransformersBackend",
    "check_moshi_checkpoint",
    "engine_arguments",
    "load_moshi",
    "make_stepper",
    "measure",
    "private_environment",
]
