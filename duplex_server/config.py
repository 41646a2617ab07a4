"""Server configuration, filled from the CLI (or tests) and read by the app."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from duplex_server.sessions.runtime.journal import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS
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
    max_sessions: int = 1000
    idle_ttl_s: float = 300.0
    disconnect_grace_s: float = 30.0
    reap_interval_s: float = 1.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    mailbox_size: int = 256
    journal_max_events: int = DEFAULT_MAX_EVENTS
    journal_max_bytes: int = DEFAULT_MAX_BYTES
    retain_audio: str = "all"
    retention_s: float = 7 * 24 * 3600.0
    purge_interval_s: float = 60.0
    api_key: str | None = None
    replica_id: str = field(default_factory=default_replica_id)
    log_level: str = "info"
    ws_per_message_deflate: bool = False
    lease_ttl_ms: int = 5000
    store_retry_ms: int = 1000
    redis_prefix: str = "dx"
    # cascade: a file of phrases (one a line) the recogniser listens for
    # instead of open English; far more accurate when the vocabulary is known.
    asr_phrases: str | None = None
    asr: str = "pocketsphinx"  # or whisper:PATH (a local checkpoint directory)
    tts: str = "espeak"  # or vits:PATH
