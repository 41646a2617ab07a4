"""Per-model starting points: thin functions returning a ``SessionConfig``."""

from __future__ import annotations

from protocol.session_config import ExtraBody, SessionUpdate


def echo(chunk_delay_ms: float = 0.0) -> SessionUpdate:
    """The loopback model; ``chunk_delay_ms`` paces it like a real speaker."""
    return SessionUpdate(
        model="echo", turn_detection=None, extra_body=ExtraBody(chunk_delay_ms=chunk_delay_ms)
    )


def telephony() -> SessionUpdate:
    """G.711 mu-law both ways at 8 kHz, as a phone bridge needs."""
    return SessionUpdate(input_audio_format="g711_ulaw", output_audio_format="g711_ulaw")


def text_only() -> SessionUpdate:
    return SessionUpdate(modalities=["text"])
