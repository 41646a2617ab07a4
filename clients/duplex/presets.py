"""Per-model starting points: thin functions returning a ``SessionConfig``.

The model presets mirror vLLM-Omni 0.30.0's ``create_duplex_session_config``
field for field (formats, rates, policies, ``extra_body``), in the spelling
its client puts on the wire: the input rate at the top level
(``sample_rate_hz``) and both rates under ``audio.*.sample_rate_hz``. A server
that holds a turn with vLLM-Omni's client then sees the same session from ours.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from clients.duplex.audio import AudioFormat
from protocol.audio_formats import PCM16, PCM_F32LE
from protocol.session_config import (
    AudioConfig,
    AudioInputConfig,
    AudioOutputConfig,
    ExtraBody,
    SessionUpdate,
    Tool,
)

MINICPMO_4_5_INPUT = AudioFormat(PCM16, 16_000)
MINICPMO_4_5_OUTPUT = AudioFormat(PCM16, 24_000)
PERSONAPLEX_INPUT = AudioFormat(PCM_F32LE, 24_000)
PERSONAPLEX_OUTPUT = AudioFormat(PCM16, 24_000)
NEMOTRON_VOICECHAT_INPUT = AudioFormat(PCM_F32LE, 16_000)
NEMOTRON_VOICECHAT_OUTPUT = AudioFormat(PCM16, 22_050)

T = TypeVar("T")


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


def minicpmo_4_5(ref_audio: str | None = None) -> SessionUpdate:
    """MiniCPM-o 4.5 native duplex: pcm16 16 kHz in, 24 kHz out; the model
    decides when to speak and listens through overlaps; only played audio
    enters history. ``ref_audio``: a data URL of the voice to clone."""
    return msgspec.structs.replace(
        _duplex(MINICPMO_4_5_INPUT, MINICPMO_4_5_OUTPUT),
        overlap_policy="listen_only",
        playback_commit_policy="ack_only",
        ref_audio=_given(ref_audio),
        extra_body=ExtraBody(auto_response=True, force_listen_count=0),
    )


def personaplex(voice: str = "NATF2.pt", persona: str = "") -> SessionUpdate:
    """PersonaPlex: float32 24 kHz in, pcm16 24 kHz out; the persona is its
    instructions (always sent, empty included, as vLLM-Omni does)."""
    return msgspec.structs.replace(
        _duplex(PERSONAPLEX_INPUT, PERSONAPLEX_OUTPUT), voice=voice, instructions=persona
    )


def nemotron_voicechat(
    instructions: str | None = None,
    tools: list[Tool] | None = None,
    idle_timeout_s: float | None = None,
) -> SessionUpdate:
    """Nemotron VoiceChat: float32 16 kHz in, pcm16 22.05 kHz out; it expects
    80 ms frames (``stream_pcm(chunk_ms=80)``). vLLM-Omni sends ``tools`` as
    ``extra_body.realtime_tools``, which ``ExtraBody`` does not model; here
    they go where the server reads tools, ``session.tools``."""
    return msgspec.structs.replace(
        _duplex(NEMOTRON_VOICECHAT_INPUT, NEMOTRON_VOICECHAT_OUTPUT),
        instructions=_given(instructions),
        tools=_given(tools),
        idle_timeout_s=_given(idle_timeout_s),
    )


def _duplex(input_format: AudioFormat, output_format: AudioFormat) -> SessionUpdate:
    """What every vLLM-Omni preset shares: both formats and rates, model-owned
    turns (``turn_detection: null``) and a response on every commit."""
    return SessionUpdate(
        modalities=["audio", "text"],
        input_audio_format=input_format.encoding,
        output_audio_format=output_format.encoding,
        sample_rate_hz=input_format.sample_rate_hz,
        audio=AudioConfig(
            input=AudioInputConfig(sample_rate_hz=input_format.sample_rate_hz),
            output=AudioOutputConfig(sample_rate_hz=output_format.sample_rate_hz),
        ),
        turn_detection=None,
        extra_body=ExtraBody(auto_response=True),
    )


def _given(value: T | None) -> T | UnsetType:
    """``None`` (the caller gave nothing) as UNSET: the field stays off the wire."""
    return UNSET if value is None else value
