"""What a model can do, as ``session.created`` announces it: clients branch
on these facts, never on model names, and the server refuses every gated
surface on a model that lacks it (PROTOCOL.md, "Server → client"; the gate
table is ``duplex_server/sessions/core/gates.py``).

The vocabulary is vLLM-Omni's ``DuplexCapabilities``, so its clients read
ours. Fields added after the first ten have defaults (what the server
itself gives every turn-based model), so a model that predates them still
declares a whole set; the built-ins declare every field.
"""

from __future__ import annotations

import msgspec

# Who may end or cut a turn (``signal_sources``): the client's events
# (commit, turn.signal, barge_in), the server's policy (server VAD), or the
# model itself, unit by unit.
CLIENT_EVENT = "client_event"
SERVER_POLICY = "server_policy"
MODEL_NATIVE = "model_native"

# Who admits sessions (``session_admission_mode``): this server's session
# manager (``--max-sessions``), or the engine holding per-session slots.
SERVING_MANAGED = "serving_managed"
ENGINE_MANAGED = "engine_managed"

# Session fields a model may declare fixed once the session is open
# (``immutable_after_open``); gates.py maps each to its refusal code.
# ``voice`` is fixed only once output audio has started.
IMMUTABLE_FIELDS = ("model", "voice", "instructions", "temperature")


class Capabilities(msgspec.Struct):
    implementation_level: str
    chunk_period_ms: int
    supports_input_append: bool
    supports_barge_in: bool
    supports_session_resume: bool
    supports_audio_truncate: bool
    supports_multi_session: bool
    # How input may arrive ("audio": input_audio_buffer.append, "text":
    # input.text.append); what the model reads of it is the modalities below.
    input_modes: list[str]
    input_formats: list[str]
    output_formats: list[str]
    supports_playback_ack: bool = True
    supports_client_commit: bool = True
    supports_external_turn_signal: bool = True
    # The model decides itself when to speak and when to yield (native duplex).
    supports_model_native_turn_policy: bool = False
    signal_sources: list[str] = msgspec.field(default_factory=lambda: [CLIENT_EVENT])
    session_admission_mode: str = SERVING_MANAGED
    # At most this much of the model's output follows a barge-in (None: not stated).
    target_barge_in_latency_ms: int | None = None
    # What a user turn must hold for the model to answer it, and what else it reads.
    required_input_modalities: list[str] = msgspec.field(default_factory=lambda: ["audio"])
    optional_input_modalities: list[str] = msgspec.field(default_factory=list)
    supports_image_input: bool = False
    # The model answers a turn that is text only (no audio in it).
    supports_text_only_turn: bool = False
    # Session fields a session.update may not change once the session is open
    # (a subset of IMMUTABLE_FIELDS). No model can be swapped inside a session.
    immutable_after_open: list[str] = msgspec.field(default_factory=lambda: ["model"])
