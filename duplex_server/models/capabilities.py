"""What every built-in model offers because the server gives it, and the
one call each model makes to declare what is its own.

The server gives every model: resume (a session is rebuilt from its log; a
native model that logs its tokens is rebuilt from its logged units, one
that does not restarts afresh), barge-in and turn.signal
(the epoch fence stops the answer where it is; a native model is told to
yield), truncation and the playback ledger (the session's history, not the
model, is cut and acknowledged), client commits (the buffer becomes a user
item; the model then answers or listens), many sessions per process, every
wire codec, and admission by the session manager. No model can be swapped
inside an open session. What differs is the model's own: what it is, its
pace, who ends its turns, and what it reads of a turn.
"""

from __future__ import annotations

from protocol.audio_formats import SUPPORTED_INPUT, SUPPORTED_OUTPUT
from protocol.capabilities import SERVING_MANAGED, Capabilities


def built_in(
    implementation_level: str,
    chunk_period_ms: int,
    *,
    signal_sources: list[str],
    native_turn_policy: bool,
    required_input_modalities: list[str],
    optional_input_modalities: list[str],
    text_only_turn: bool,
) -> Capabilities:
    """``signal_sources``: who ends or cuts its turns; the modalities: what a
    turn must hold for it to answer, and what else it reads."""
    return Capabilities(
        implementation_level=implementation_level,
        chunk_period_ms=chunk_period_ms,
        supports_input_append=True,
        supports_barge_in=True,
        supports_session_resume=True,
        supports_audio_truncate=True,
        supports_multi_session=True,
        # Text appends are taken into the conversation on every model
        # (required/optional_input_modalities say whether the model reads them).
        input_modes=["audio", "text"],
        input_formats=list(SUPPORTED_INPUT),
        output_formats=list(SUPPORTED_OUTPUT),
        supports_playback_ack=True,
        supports_client_commit=True,
        supports_external_turn_signal=True,
        supports_model_native_turn_policy=native_turn_policy,
        signal_sources=signal_sources,
        session_admission_mode=SERVING_MANAGED,
        # A barge-in fences the answer at once; the chunk (or unit) in flight
        # is dropped, so the output stops within one chunk period.
        target_barge_in_latency_ms=chunk_period_ms,
        required_input_modalities=required_input_modalities,
        optional_input_modalities=optional_input_modalities,
        # Video frames on appends are logged; no built-in model looks at them.
        supports_image_input=False,
        supports_text_only_turn=text_only_turn,
        immutable_after_open=["model"],
    )
