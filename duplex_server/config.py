"""Server configuration, filled from the CLI (or tests) and read by the app."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from duplex_server.sessions.runtime.actor import ActorSettings
from duplex_server.sessions.runtime.manager import ManagerSettings
from protocol.codec import DEFAULT_MAX_FRAME_BYTES


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    store: str = "memory"
    durability: str = "fsync-per-batch"
    model: str = "cascade"
    # The names the model answers to (vLLM's --served-model-name; none: the
    # adapter's own name); OpenAI's realtime model names are aliases of it
    # unless told not (sessions/core/model_names.py).
    served_model_name: list[str] = field(default_factory=list)
    no_openai_model_aliases: bool = False
    # The session settings' defaults are the runtime's own (declared once).
    max_sessions: int = ManagerSettings.max_sessions
    idle_ttl_s: float = ManagerSettings.idle_ttl_s
    disconnect_grace_s: float = ManagerSettings.disconnect_grace_s
    reap_interval_s: float = ManagerSettings.reap_interval_s
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    mailbox_size: int = ActorSettings.mailbox_size
    journal_max_events: int = ActorSettings.journal_max_events
    journal_max_bytes: int = ActorSettings.journal_max_bytes
    retain_audio: str = ActorSettings.retain_audio
    max_input_realtime_factor: float = ActorSettings.max_input_realtime_factor
    input_burst_ms: float = ActorSettings.input_burst_ms
    max_session_media_bytes: int = ActorSettings.max_session_media_bytes
    text_delta_interval_ms: float = ActorSettings.text_delta_interval_ms
    retention_s: float = ManagerSettings.retention_s
    purge_interval_s: float = ManagerSettings.purge_interval_s
    ended_sessions_kept: int = ManagerSettings.ended_sessions_kept
    api_key: str | None = None
    api_keys_file: str | None = None  # named keys with scopes and quotas (auth.KeyRing)
    # A request head must arrive whole within this; an autostart=0 socket
    # must send its first event within handshake_timeout_s.
    header_timeout_s: float = 10.0
    handshake_timeout_s: float = 10.0
    # Open HTTP connections, and open WebSockets, per client address (0: no cap).
    # Generous: a relay (an agent framework's backend) opens every session
    # from one address; still well under max_sessions.
    max_connections_per_ip: int = 256
    # New connections a second per client address, with two seconds' burst
    # (0: no bound); past it a connection is closed before it is read.
    max_connection_rate_per_ip: float = 20.0
    # Live sessions (attached or waiting for a resume) opened from one
    # address, and by one key unless the keys file gives it a quota (0: no cap).
    max_sessions_per_ip: int = 256
    max_sessions_per_key: int = 0
    # Browser pages whose WebSockets are accepted (an Origin header not listed
    # is refused; none listed: any), and the Host names served ("*": any).
    allowed_origins: list[str] = field(default_factory=list)
    allowed_hosts: list[str] = field(default_factory=lambda: ["*"])
    # TLS: both set, the server speaks https and wss only.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    replica_id: str = field(default_factory=default_replica_id)
    log_level: str = "info"
    log_format: str = "text"  # or json: one object a line (duplex_server.log_format)
    ws_per_message_deflate: bool = False
    lease_ttl_ms: int = 5000
    store_retry_ms: int = 1000
    redis_prefix: str = "dx"
    # cascade: a file of phrases (one a line) the recogniser listens for
    # instead of open English; far more accurate when the vocabulary is known.
    asr_phrases: str | None = None
    asr: str = "auto"  # whisper-ct2 when its package is installed, else pocketsphinx
    tts: str = "espeak"  # or piper, piper:PATH, vits:PATH
    # batch API: local diffusers pipeline directories (None: the routes answer
    # that no model is loaded)
    image_model: str | None = None
    video_model: str | None = None
    # cascade: answer with this local chat checkpoint instead of the parrot
    llm: str | None = None
    llm_backend: str = "auto"  # vllm where it can size its KV cache, else transformers
    llm_dtype: str = "auto"
    llm_max_new_tokens: int = 256
    llm_max_model_len: int | None = None  # None: the checkpoint's own window
    llm_max_num_seqs: int = 64  # answers decoded together
    llm_kv_cache_bytes: int | None = None  # vLLM's KV cache size (CPU needs one)
    llm_gpu_memory_utilization: float = 0.9  # vLLM on a GPU
    llm_chat_template: str | None = None  # a Jinja file, for checkpoints without one
    # batch API (batch_api/): where job results' media live (None: beside the
    # SQLite file, ./data/blobs for Redis, a temporary folder for memory),
    # how long a finished job's result is kept, jobs in flight (all, and per
    # key), and the largest upload a request may carry.
    blob_dir: str | None = None
    batch_retention_s: float = 86_400.0
    batch_max_jobs: int = 64
    batch_max_jobs_per_key: int = 8
    batch_cpu_workers: int = 1  # threads for jobs' encoding and decoding
    max_upload_bytes: int = 25 * 1024 * 1024  # OpenAI's limit for audio files
    # --model moshi:PATH: where its weights run, their dtype, its batch's rows
    device: str = "cpu"
    dtype: str = "auto"
    moshi_rows: int = 8
    voices: str | None = None  # --model moshi:PATH: a directory of voice prompts
    moshi_step: str = "eager"  # the batched step: transformers' modules, or the fast one
    llm_enforce_eager: bool = False  # vLLM: skip torch.compile (starts faster, decodes slower)
    llm_threads: int = 1  # transformers on a CPU: its decode thread's intra-op threads
