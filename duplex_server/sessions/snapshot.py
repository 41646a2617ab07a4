"""Project the folded state into the wire ``session`` object."""

from __future__ import annotations

from duplex_server.sessions.state import SessionState
from protocol.audio_formats import ga_type
from protocol.server_events import (
    AudioFormatDescription,
    Capabilities,
    PlaybackLedger,
    SessionAudio,
    SessionAudioInput,
    SessionAudioOutput,
    SessionExtraBody,
    SessionObject,
)


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


def turn_state(state: SessionState) -> str:
    if state.closed_reason is not None:
        return "closed"
    return "speaking" if state.response is not None else "listening"


def session_object(state: SessionState, capabilities: Capabilities) -> SessionObject:
    cfg = state.config
    response = state.response or state.last_response
    in_fmt, out_fmt = cfg.input_format, cfg.output_format
    return SessionObject(
        id=state.session_id,
        model=cfg.model,
        modalities=list(cfg.modalities),
        output_modalities=list(cfg.modalities),
        instructions=cfg.instructions,
        voice=cfg.voice,
        input_audio_format=in_fmt.name,
        output_audio_format=out_fmt.name,
        audio=SessionAudio(
            input=SessionAudioInput(
                format=AudioFormatDescription(ga_type(in_fmt.name), in_fmt.sample_rate_hz),
                turn_detection=cfg.turn_detection,
                transcription=cfg.input_audio_transcription,
            ),
            output=SessionAudioOutput(
                format=AudioFormatDescription(ga_type(out_fmt.name), out_fmt.sample_rate_hz),
                voice=cfg.voice,
                speed=cfg.speed,
            ),
        ),
        turn_detection=cfg.turn_detection,
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
            auto_response=cfg.auto_response,
            force_listen_count=cfg.force_listen_count,
            chunk_delay_ms=cfg.chunk_delay_ms,
        ),
        state="closed" if state.closed_reason is not None else "open",
        turn_state=turn_state(state),
        epoch=state.epoch,
        turn_id=state.turn_id,
        active_response_id=state.response.id if state.response else None,
        active_item_id=state.response.item_id if state.response else None,
        playback=ledger(response.playback if response else None),
        capabilities=capabilities,
    )
