"""Effective session configuration and the pure patch merge.

``merge_config`` runs twice for every ``session.update``: once when the
actor validates the patch (it may raise :class:`ProtocolError`) and again in
the fold, where the same patch is known good.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from protocol.audio_formats import (
    SUPPORTED_INPUT,
    SUPPORTED_OUTPUT,
    AudioFormat,
    resolve_format,
)
from protocol.errors import ProtocolError
from protocol.session_config import InputTranscription, SessionUpdate, Tool, TurnDetection

TURN_DETECTION_DEFAULTS = TurnDetection(
    type="server_vad", threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500
)


class EffectiveConfig(msgspec.Struct):
    model: str
    modalities: list[str] = msgspec.field(default_factory=lambda: ["audio", "text"])
    instructions: str = ""
    voice: str = "default"
    input_format: AudioFormat = AudioFormat("pcm16", 24_000)
    output_format: AudioFormat = AudioFormat("pcm16", 24_000)
    turn_detection: TurnDetection | None = None
    input_audio_transcription: InputTranscription | None = None
    tools: list[Tool] = msgspec.field(default_factory=list)
    tool_choice: str = "auto"
    temperature: float = 0.8
    max_output_tokens: int | str = "inf"
    speed: float = 1.0
    overlap_policy: str = "barge_in_on_speech"
    playback_commit_policy: str = "ack_only"
    idle_timeout_s: float | None = None
    ref_audio: str | None = None
    auto_response: bool = True
    force_listen_count: int = 0
    chunk_delay_ms: float = 0.0


def _set(value, fallback):
    return fallback if value is UNSET else value


def _turn_detection(
    current: TurnDetection | None, patch: TurnDetection | None, allowed: tuple[str, ...]
) -> TurnDetection | None:
    if patch is None:
        return None
    if patch.type not in allowed:
        raise ProtocolError(
            "unsupported_turn_detection",
            f"turn_detection {patch.type!r} is not supported by this model; "
            f"use null (model-owned) or one of: {', '.join(allowed) or 'none'}",
            param="session.turn_detection.type",
        )
    base = current if current is not None else TURN_DETECTION_DEFAULTS
    merged = {f: getattr(base, f) for f in base.__struct_fields__}
    merged.update(
        {f: getattr(patch, f) for f in patch.__struct_fields__ if getattr(patch, f) is not UNSET}
    )
    return TurnDetection(**merged)


def merge_config(
    config: EffectiveConfig, patch: SessionUpdate, turn_detection_types: tuple[str, ...]
) -> EffectiveConfig:
    audio_in = patch.audio.input if patch.audio is not UNSET else UNSET
    audio_out = patch.audio.output if patch.audio is not UNSET else UNSET
    input_spec = _set(patch.input_audio_format, UNSET)
    if input_spec is UNSET and audio_in is not UNSET:
        input_spec = audio_in.format
    output_spec = _set(patch.output_audio_format, UNSET)
    if output_spec is UNSET and audio_out is not UNSET:
        output_spec = audio_out.format
    turn_patch = patch.turn_detection
    if turn_patch is UNSET and audio_in is not UNSET:
        turn_patch = audio_in.turn_detection
    transcription = patch.input_audio_transcription
    if transcription is UNSET and audio_in is not UNSET:
        transcription = audio_in.transcription
    voice = _set(patch.voice, UNSET)
    speed = _set(patch.speed, UNSET)
    if audio_out is not UNSET:
        voice = _set(voice, audio_out.voice)
        speed = _set(speed, audio_out.speed)
    extra = patch.extra_body
    return msgspec.structs.replace(
        config,
        model=_set(patch.model, config.model),
        modalities=list(_set(patch.output_modalities, _set(patch.modalities, config.modalities))),
        instructions=_set(patch.instructions, config.instructions),
        voice=_set(voice, config.voice),
        input_format=_format(
            input_spec,
            patch.input_sample_rate_hz,
            config.input_format,
            "session.input_audio_format",
            SUPPORTED_INPUT,
        ),
        output_format=_format(
            output_spec,
            patch.output_sample_rate_hz,
            config.output_format,
            "session.output_audio_format",
            SUPPORTED_OUTPUT,
        ),
        turn_detection=(
            config.turn_detection
            if turn_patch is UNSET
            else _turn_detection(config.turn_detection, turn_patch, turn_detection_types)
        ),
        input_audio_transcription=_set(transcription, config.input_audio_transcription),
        tools=list(_set(patch.tools, config.tools)),
        tool_choice=_set(patch.tool_choice, config.tool_choice),
        temperature=_set(patch.temperature, config.temperature),
        max_output_tokens=_set(
            patch.max_output_tokens,
            _set(patch.max_response_output_tokens, config.max_output_tokens),
        ),
        speed=_set(speed, config.speed),
        overlap_policy=_set(patch.overlap_policy, config.overlap_policy),
        playback_commit_policy=_set(patch.playback_commit_policy, config.playback_commit_policy),
        idle_timeout_s=_set(patch.idle_timeout_s, config.idle_timeout_s),
        ref_audio=_set(patch.ref_audio, config.ref_audio),
        auto_response=config.auto_response
        if extra is UNSET
        else _set(extra.auto_response, config.auto_response),
        force_listen_count=config.force_listen_count
        if extra is UNSET
        else _set(extra.force_listen_count, config.force_listen_count),
        chunk_delay_ms=config.chunk_delay_ms
        if extra is UNSET
        else _set(extra.chunk_delay_ms, config.chunk_delay_ms),
    )


def _format(spec, rate, current: AudioFormat, param: str, supported) -> AudioFormat:
    if spec is UNSET and rate is UNSET:
        return current
    if spec is UNSET:
        spec = current.name
    return resolve_format(
        spec, param=param, supported=supported, rate_hz=None if rate is UNSET else rate
    )
