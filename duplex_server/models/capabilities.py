"""Capabilities shared by the built-in adapters: every surface of the
protocol, every codec; they differ only in what they are and their pace."""

from __future__ import annotations

from protocol.audio_formats import SUPPORTED_INPUT, SUPPORTED_OUTPUT
from protocol.capabilities import Capabilities


def full_duplex(implementation_level: str, chunk_period_ms: int) -> Capabilities:
    return Capabilities(
        implementation_level=implementation_level,
        chunk_period_ms=chunk_period_ms,
        supports_input_append=True,
        supports_barge_in=True,
        supports_session_resume=True,
        supports_audio_truncate=True,
        supports_multi_session=True,
        input_modes=["audio", "text"],
        input_formats=list(SUPPORTED_INPUT),
        output_formats=list(SUPPORTED_OUTPUT),
    )
