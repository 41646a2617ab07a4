"""Project the folded state into the wire ``session`` object."""

from __future__ import annotations

import msgspec

from duplex_server.sessions.core.config import ECHOED_FIELDS, auto_responds
from duplex_server.sessions.core.state import SessionState
from protocol.audio_formats import AudioFormat, ga_type
from protocol.server_events import (
    AudioFormatDescription,
    Capabilities,
    PlaybackLedger,
    SessionAudio,
    SessionAudioInput,
    SessionAudioOutput,
    SessionDuplex,
    SessionExtraBody,
    SessionObject,
    TranscriptionSessionObject,
)
from protocol.session_config import ServerTurnDetection


def ledger(playback: PlaybackLedger | None) -> PlaybackLedger:
    """The wire copy of a ledger, rounded to microseconds of audio."""
    if playback is None:
        return PlaybackLedger()
    return PlaybackLedger(
        generated_ms=round(playback.generated_ms, 3),
        sent_ms=round(playback.sent_ms, 3),
        played_ms=round(playback.played_ms, 3),
        committed_ms=round(playback.committed_ms, 3),
    )


# OpenAI's session describes only these: pcm16 at 24 kHz and G.711.
_OPENAI_RATE = {"pcm16": 24_000, "g711_ulaw": None, "g711_alaw": None}


def openai_format(fmt: AudioFormat) -> tuple[str | None, AudioFormatDescription | None]:
    """The beta string and the GA object for ``fmt``, or (None, None) where
    OpenAI's schema has no spelling for it (the truth is in ``duplex``)."""
    if fmt.name not in _OPENAI_RATE or _OPENAI_RATE[fmt.name] not in (None, fmt.sample_rate_hz):
        return None, None
    return fmt.name, AudioFormatDescription(ga_type(fmt.name), fmt.sample_rate_hz)


# OpenAI's ``object`` of each session type.
SESSION_OBJECT = {
    "realtime": "realtime.session",
    "transcription": "realtime.transcription_session",
}


def turn_state(state: SessionState) -> str:
    if state.closed_reason is not None:
        return "closed"
    return "speaking" if state.response is not None else "listening"


def _detection(state: SessionState) -> ServerTurnDetection | None:
    detection = state.config.turn_detection
    return None if detection is None else ServerTurnDetection(**msgspec.structs.asdict(detection))


def _duplex(state: SessionState) -> SessionDuplex:
    in_fmt, out_fmt = state.config.input_format, state.config.output_format
    return SessionDuplex(
        input_format=AudioFormatDescription(in_fmt.name, in_fmt.sample_rate_hz),
        output_format=AudioFormatDescription(out_fmt.name, out_fmt.sample_rate_hz),
    )


def transcription_session_object(state: SessionState) -> TranscriptionSessionObject:
    """The beta ``transcription_session.updated``'s session."""
    cfg = state.config
    return TranscriptionSessionObject(
        id=state.session_id,
        input_audio_format=openai_format(cfg.input_format)[0],
        input_audio_transcription=cfg.input_audio_transcription,
        turn_detection=_detection(state),
        input_audio_noise_reduction=cfg.input_audio_noise_reduction,
        include=cfg.include,
        duplex=_duplex(state),
    )


def session_object(state: SessionState, capabilities: Capabilities) -> SessionObject:
    cfg = state.config
    response = state.response or state.last_response
    in_fmt, out_fmt = cfg.input_format, cfg.output_format
    detection = _detection(state)
    in_name, in_ga = openai_format(in_fmt)
    out_name, out_ga = openai_format(out_fmt)
    return SessionObject(
        id=state.session_id,
        model=cfg.model,
        modalities=list(cfg.modalities),
        output_modalities=list(cfg.modalities),
        instructions=cfg.instructions,
        voice=cfg.voice,
        input_audio_format=in_name,
        output_audio_format=out_name,
        audio=SessionAudio(
            input=SessionAudioInput(
                format=in_ga,
                turn_detection=detection,
                transcription=cfg.input_audio_transcription,
                noise_reduction=cfg.input_audio_noise_reduction,
            ),
            output=SessionAudioOutput(
                format=out_ga,
                voice=cfg.voice,
                speed=cfg.speed,
            ),
        ),
        turn_detection=detection,
        input_audio_transcription=cfg.input_audio_transcription,
        tools=list(cfg.tools),
        tool_choice=cfg.tool_choice,
        temperature=cfg.temperature,
        max_response_output_tokens=cfg.max_output_tokens,
        speed=cfg.speed,
        overlap_policy=cfg.overlap_policy,
        playback_commit_policy=cfg.playback_commit_policy,
        idle_timeout_s=cfg.idle_timeout_s,
        extra_body=SessionExtraBody(
            auto_response=auto_responds(cfg),
            force_listen_count=cfg.force_listen_count,
            chunk_delay_ms=cfg.chunk_delay_ms,
            overlap_short_ack_ms=cfg.overlap_short_ack_ms,
            overlap_barge_in_ms=cfg.overlap_barge_in_ms,
            overlap_silence_rms=cfg.overlap_silence_rms,
            return_stage_metrics=cfg.return_stage_metrics,
            duplex_events=cfg.sends_extensions,
        ),
        duplex=_duplex(state),
        state="closed" if state.closed_reason is not None else "open",
        turn_state=turn_state(state),
        epoch=state.epoch,
        turn_id=state.turn_id,
        active_response_id=state.response.id if state.response else None,
        active_item_id=state.response.item_id if state.response else None,
        playback=ledger(response.playback if response else None),
        capabilities=capabilities,
        input_audio_noise_reduction=cfg.input_audio_noise_reduction,
        **{name: getattr(cfg, name) for name in ECHOED_FIELDS},
        type=cfg.session_type,
        object=SESSION_OBJECT[cfg.session_type],
    )
