"""Starlette application factory: wires config, log, model and routes."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from batch_api import BatchApi, default_blob_dir
from duplex_server import http_errors, http_routes, metrics, openapi
from duplex_server.auth import EphemeralKeys, KeyRing
from duplex_server.client_secrets import client_secrets
from duplex_server.config import ServerConfig, manager_settings
from duplex_server.engine.audio.remote_speech import RemoteSpeechOptions
from duplex_server.engine.llm import LLMOptions, RemoteOptions
from duplex_server.engine.llm.remote import parse_request_args
from duplex_server.jobs import s3_blobs
from duplex_server.jobs.blobs import BlobStore
from duplex_server.models import build_model, close_model
from duplex_server.realtime import realtime_endpoint
from duplex_server.sessions.core.model_names import ModelNames
from duplex_server.sessions.log.media import SegmentBlobs
from duplex_server.sessions.log.memory_store import MemoryLog
from duplex_server.sessions.log.redis_store import REDIS_SCHEMES, RedisLog
from duplex_server.sessions.log.sqlite_store import SqliteLog
from duplex_server.sessions.log.store import SessionLog
from duplex_server.sessions.runtime.manager import SessionManager
from duplex_server.telephony.call_config import CallConfigs
from duplex_server.telephony.stream import twilio_stream
from duplex_server.telephony.twilio_signature import require_twilio
from duplex_server.telephony.webhook import STREAM_PATH, VOICE_PATH, twilio_voice
from duplex_server.webrtc.network import RtcNetwork
from duplex_server.webrtc.routes import CALLS_PATH, LiveCalls, create_call, hang_up
from protocol.codec import FrameDecoder

STORES = ("memory", "sqlite:PATH", "redis://HOST:PORT/DB")


def open_store(config: ServerConfig) -> SessionLog:
    """``memory``, ``sqlite:PATH`` or a Redis URL; raises ValueError or
    StoreError with the reason."""
    spec = config.store
    if spec == "memory":
        if config.media_dir:
            raise ValueError("--media-dir needs a durable store (sqlite:PATH or redis://…)")
        return MemoryLog()
    if config.media_dir:
        refuse_shared_blob_dir(config, config.media_dir)
    if spec.startswith(REDIS_SCHEMES):
        return RedisLog(
            spec,
            lease_ttl_ms=config.lease_ttl_ms,
            retry_window_ms=config.store_retry_ms,
            prefix=config.redis_prefix,
            media=media_blobs(config.media_dir),
        )
    if spec.startswith("sqlite:"):
        path = spec.removeprefix("sqlite:")
        if not path:
            raise ValueError("sqlite store needs a path: --store sqlite:./data/sessions.db")
        log = SqliteLog(
            path,
            config.durability,  # type: ignore[arg-type]  # CLI choices
            media_dir=config.media_dir,
            open_media=open_media,
        )
        if log.media_location is not None:  # given, or the one the database remembers
            refuse_shared_blob_dir(config, log.media_location)
        return log
    raise ValueError(f"unknown store {spec!r}; available: {', '.join(STORES)}")


def refuse_shared_blob_dir(config: ServerConfig, media: str) -> None:
    """The job runner deletes every blob of its folder that no job names,
    and the media sweep every segment no session lists: sharing one folder
    (or one inside the other), each would take the other's files."""
    blobs = config.blob_dir or str(default_blob_dir(config.store))
    if _overlap(blobs, media):
        raise ValueError(
            f"--blob-dir {blobs} and --media-dir {media}: give them folders of their own "
            "(each sweep deletes the other's files as unknown)"
        )


def _overlap(one: str, other: str) -> bool:
    """The same place, or one inside the other: object stores by their URLs,
    folders by their resolved paths."""
    if one.startswith(s3_blobs.SCHEME) or other.startswith(s3_blobs.SCHEME):
        one, other = one.rstrip("/"), other.rstrip("/")
        return one == other or one.startswith(other + "/") or other.startswith(one + "/")
    a, b = Path(one).resolve(), Path(other).resolve()
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def media_blobs(location: str | None) -> SegmentBlobs | None:
    """``--media-dir``, if given (:func:`open_media`)."""
    return open_media(location) if location else None


def open_media(location: str) -> SegmentBlobs:
    """A media location: a folder, or an object store (``s3://bucket/prefix``,
    for replicas on several hosts), whose bucket must answer at start."""
    if location.startswith(s3_blobs.SCHEME):
        blobs = s3_blobs.S3Blobs(location)
        try:
            blobs.check_sync()
        except OSError as exc:
            raise ValueError(f"--media-dir {location}: {exc}") from exc
        return blobs
    return BlobStore(location)


def read_phrases(path: str | None) -> list[str] | None:
    if path is None:
        return None
    phrases = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    if not phrases:
        raise ValueError(f"--asr-phrases {path}: no phrases in the file")
    return phrases


def llm_options(config: ServerConfig) -> LLMOptions | RemoteOptions | None:
    """``--llm PATH`` (in process) or ``--llm-url URL`` (another server): one of them."""
    if config.llm_url is not None:
        if config.llm is not None:
            raise ValueError("--llm and --llm-url: choose one (in process, or another server)")
        return RemoteOptions(
            config.llm_url,
            config.llm_model or "",
            api_key=config.llm_api_key,
            timeout_s=config.llm_timeout_s,
            retries=config.llm_retries,
            max_requests=config.llm_max_num_seqs,
            max_new_tokens=config.llm_max_new_tokens,
            request_args=parse_request_args(config.llm_request_arg),
        )
    if config.llm is None:
        return None
    return LLMOptions(
        config.llm,
        backend=config.llm_backend,
        dtype=config.llm_dtype,
        max_new_tokens=config.llm_max_new_tokens,
        max_model_len=config.llm_max_model_len,
        max_num_seqs=config.llm_max_num_seqs,
        kv_cache_bytes=config.llm_kv_cache_bytes,
        gpu_memory_utilization=config.llm_gpu_memory_utilization,
        chat_template=config.llm_chat_template,
        device=config.device,
        enforce_eager=config.llm_enforce_eager,
        threads=config.llm_threads,
        tensor_parallel_size=config.llm_tensor_parallel_size,
        pipeline_parallel_size=config.llm_pipeline_parallel_size,
        engine_args=tuple(config.llm_engine_arg),
    )


def speech_options(
    config: ServerConfig,
) -> tuple[RemoteSpeechOptions | None, RemoteSpeechOptions | None]:
    """``--asr-url`` / ``--tts-url``: the cascade's recogniser / voice on another
    server, each with the shared key, timeout, retries and bound."""

    def remote(url: str | None, model: str, option: str) -> RemoteSpeechOptions | None:
        if url is None:
            return None
        try:
            return RemoteSpeechOptions(
                url,
                model,
                api_key=config.speech_api_key,
                timeout_s=config.speech_timeout_s,
                retries=config.speech_retries,
                max_requests=config.speech_max_requests,
                sample_rate_hz=config.tts_sample_rate,
            )
        except ValueError as exc:
            raise ValueError(f"{option} {exc}") from None

    return (
        remote(config.asr_url, config.asr_model, "--asr-url"),
        remote(config.tts_url, config.tts_model, "--tts-url"),
    )


def key_ring(config: ServerConfig) -> KeyRing:
    if config.api_keys_file is not None:
        if config.api_key is not None:
            raise ValueError("--api-key and --api-keys-file: choose one")
        return KeyRing.load(config.api_keys_file)
    return KeyRing.single(config.api_key)


def model_names(config: ServerConfig, adapter_name: str) -> ModelNames:
    """The names the served model answers to (``--served-model-name``)."""
    served = ModelNames.of(adapter_name, config.served_model_name)
    return ModelNames(served.served, openai_aliases=not config.no_openai_model_aliases)


def create_app(config: ServerConfig) -> Starlette:
    keys = key_ring(config)
    call_configs = CallConfigs.load(config.telephony_config)  # a bad file: refused at start
    if config.twilio_auth_token is not None:
        require_twilio()  # refused at start, not at the first call
    log = open_store(config)
    asr_remote, tts_remote = speech_options(config)
    model = build_model(
        config.model,
        asr_phrases=read_phrases(config.asr_phrases),
        asr=config.asr,
        tts=config.tts,
        llm=llm_options(config),
        asr_remote=asr_remote,
        tts_remote=tts_remote,
        device=config.device,
        dtype=config.dtype,
        moshi_rows=config.moshi_rows,
        moshi_voices=config.voices,
        moshi_step=config.moshi_step,
    )
    manager = SessionManager(
        log,
        model,
        manager_settings(config, model_names(config, model.name)),
    )

    batch = BatchApi.build(config, log, model)
    rtc_network = RtcNetwork.from_settings(
        config.rtc_ice_servers, config.rtc_host, config.rtc_udp_ports
    )  # a bad setting: refused at start
    rtc_calls = LiveCalls()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await manager.recover_or_defer()
        manager.start()
        await batch.start()
        yield
        await rtc_calls.close_all()
        await batch.shutdown()
        await manager.shutdown()
        await asyncio.to_thread(close_model, model)
        await log.close()

    app = Starlette(
        exception_handlers={HTTPException: http_errors.starlette_refusal},
        routes=[
            Route("/", http_routes.voice_page),
            Mount("/static", StaticFiles(directory=http_routes.WEB_DIR), name="static"),
            Route("/health", http_routes.health),
            Route("/ready", http_routes.ready),
            Route("/version", http_routes.version),
            Route("/openapi.json", openapi.openapi_json),
            Route("/v1/models", http_routes.models),
            Route("/v1/realtime/client_secrets", client_secrets, methods=["POST"]),
            Route(CALLS_PATH, create_call, methods=["POST"]),
            Route(CALLS_PATH + "/{call_id}/hangup", hang_up, methods=["POST"]),
            Route("/metrics", http_routes.metrics),
            Route("/v1/sessions/{session_id}", http_routes.session_detail),
            Route("/v1/sessions/{session_id}/events", http_routes.session_events),
            WebSocketRoute("/v1/realtime", realtime_endpoint),
            WebSocketRoute("/v1/duplex", realtime_endpoint),
            Route(VOICE_PATH, twilio_voice, methods=["POST"]),
            WebSocketRoute(STREAM_PATH, twilio_stream),
            *batch.routes,
        ],
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=config.allowed_hosts),
            # Browser apps call the HTTP routes from their own origin (PROTOCOL.md):
            # with bearer keys, never cookies, so no credentials are allowed.
            Middleware(
                CORSMiddleware,
                allow_origins=config.allowed_origins or ["*"],
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["authorization", "content-type", "openai-beta"],
                expose_headers=["location", "retry-after"],
            ),
        ],
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.keys = keys
    app.state.ephemeral = EphemeralKeys()
    app.state.log = log
    app.state.model = model
    app.state.model_names = model_names(config, model.name)
    app.state.manager = manager
    app.state.batch = batch
    app.state.metrics = metrics.app_registry(manager.live_by_model)
    app.state.decoder = FrameDecoder(config.max_frame_bytes)
    app.state.sockets_per_address = Counter()  # open WebSockets per client address
    app.state.call_configs = call_configs
    app.state.calls_in_setup = 0  # carrier media streams connected, not yet started
    app.state.rtc_network = rtc_network
    app.state.rtc_calls = rtc_calls
    return app
