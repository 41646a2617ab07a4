"""What the manager tells each session actor: its owner name and its bounds.

Built once from the server's settings (``duplex_server/config.py``) and
shared by every actor the manager starts."""

from __future__ import annotations

from dataclasses import dataclass

from duplex_server.sessions.core.model_names import ModelNames
from duplex_server.sessions.core.turns import BACKCHANNEL_MAX_MS, BACKCHANNEL_WORDS
from duplex_server.sessions.runtime.journal import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS
from duplex_server.sessions.runtime.log_writer import DEFAULT_SNAPSHOT_EVERY


@dataclass
class ActorSettings:
    owner: str
    mailbox_size: int = 256
    journal_max_events: int = DEFAULT_MAX_EVENTS
    journal_max_bytes: int = DEFAULT_MAX_BYTES
    # "all": keep input audio in the log; "uncommitted": once the client has
    # acknowledged a turn's commit, its samples are compacted to metadata.
    retain_audio: str = "all"
    # Input media admitted per second of wall time, and the burst beyond it
    # (token bucket, runtime/input_budget.py); a factor of 0 lifts the bound.
    max_input_realtime_factor: float = 2.0
    input_burst_ms: float = 10_000.0
    # Media (audio samples, video frames) one session may put in the log.
    max_session_media_bytes: int = 1024 * 1024 * 1024
    # After a response's first text delta, text gathers this long before the
    # next one: a delta, record and frame per interval, not per token (0: each
    # token as it comes). Audio and function calls never wait.
    text_delta_interval_ms: float = 20.0
    # The names the model answers to (None: its adapter's name, and OpenAI's
    # realtime names as aliases).
    model_names: ModelNames | None = None
    # Sustained speech over the answer that is all these words (comma-
    # separated; empty: none) and ends within backchannel_max_ms does not
    # cut it (duplex wire; runtime/hearing.py).
    backchannel_words: str = BACKCHANNEL_WORDS
    backchannel_max_ms: float = BACKCHANNEL_MAX_MS
    # A ``snapshot`` record (the folded state) follows this many records, so
    # a restore refolds at most about this many (0: no snapshots).
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY
