"""input_audio_buffer.append: the audio's format, decoding (the runtime also
decodes large appends off the event loop with ``append_format`` and
``decode_append``), the timing and transcript a client declares, the video
frames an append may carry, and the bounds on one turn's input."""

from __future__ import annotations

from collections.abc import Callable

from duplex_server.audio import pcm16_duration_ms
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands.given import NOT_PREPARED, ModelFacts, PreparedAppend
from duplex_server.sessions.core.commands.shared import _asked, _check_epoch, decode_audio
from duplex_server.sessions.core.effects import Effects
from duplex_server.sessions.core.records import AudioBody, FrameBody
from duplex_server.sessions.core.state import SessionState
from protocol import client_events as ce
from protocol.audio_formats import OPUS, SUPPORTED_INPUT, AudioFormat, resolve_format
from protocol.codec import decode_base64, strip_data_url
from protocol.errors import ProtocolError


def append_format(state: SessionState, event: ce.InputAudioAppend) -> AudioFormat:
    """The format an append's audio is in, after the checks that come before
    decoding it (its epoch, its format and rate)."""
    _check_epoch(state, event)
    return _input_format(state, event)


def decode_append(
    event: ce.InputAudioAppend, fmt: AudioFormat, stream_decoder: Callable[[bytes], bytes] | None
) -> bytes:
    """An append's audio as pcm16 (pure apart from ``stream_decoder``'s state:
    Opus packets depend on the ones before); ProtocolError if undecodable."""
    raw = decode_base64(event.audio, param="audio", event_id=event.event_id)
    if stream_decoder is not None and fmt.name == OPUS:
        try:
            return stream_decoder(raw)
        except ValueError as exc:  # the codec's error: an undecodable packet
            raise ProtocolError(
                "invalid_audio", str(exc), param="audio", event_id=event.event_id
            ) from None
    return decode_audio(raw, fmt, event.event_id, "audio")


def _input_format(state: SessionState, event: ce.InputAudioAppend) -> AudioFormat:
    try:
        spec, rate = event.format_named(), event.rate_named()
        if spec is None and rate is None:
            return state.config.input_format
        param = "format" if event.format is not None or spec is None else "input_audio_format"
        if spec is None:
            spec = state.config.input_format.name
        return resolve_format(spec, param=param, supported=SUPPORTED_INPUT, rate_hz=rate)
    except ProtocolError as err:
        err.event_id = event.event_id
        raise


DECLARED_SLACK_MS = 1.0  # a client's rounding of a duration it declares


MAX_CLIENT_TRANSCRIPT_CHARS = 65_536  # per turn


def _declared_timing(
    state: SessionState, event: ce.InputAudioAppend, fmt: AudioFormat, duration_ms: float
) -> float | None:
    """The chunk's end on the input timeline, from what the client declared;
    a declared duration or start the audio contradicts is refused: the
    client reads its audio in another format or rate than it said, and a
    silently wrong rate corrupts the session."""
    declared = _asked(event, event.duration_named)
    if declared is not None and abs(declared - duration_ms) > DECLARED_SLACK_MS:
        raise ProtocolError(
            "invalid_audio",
            f"the audio is {duration_ms:.1f} ms as {fmt.name} at {fmt.sample_rate_hz} Hz, "
            f"but the event declares {declared} ms: check its format and sample rate",
            param="duration_ms" if event.duration_ms is not None else "audio_duration_ms",
            event_id=event.event_id,
        )
    end_ms = event.audio_end_ms
    if event.audio_start_ms is not None:
        derived = event.audio_start_ms + duration_ms
        if end_ms is not None and abs(end_ms - derived) > DECLARED_SLACK_MS:
            raise ProtocolError(
                "invalid_audio",
                f"audio_start_ms {event.audio_start_ms} plus the chunk's {duration_ms:.1f} ms "
                f"is not audio_end_ms {end_ms}",
                param="audio_start_ms",
                event_id=event.event_id,
            )
        end_ms = derived if end_ms is None else end_ms
    transcript = event.transcript or ""
    if len(state.input.client_transcript) + len(transcript) > MAX_CLIENT_TRANSCRIPT_CHARS:
        raise ProtocolError(
            "input_audio_buffer_full",
            f"one turn's transcripts hold at most {MAX_CLIENT_TRANSCRIPT_CHARS} characters",
            param="transcript",
            event_id=event.event_id,
        )
    return end_ms


def audio_append(
    batch: Batch,
    event: ce.InputAudioAppend,
    facts: ModelFacts,
    prepared: PreparedAppend = NOT_PREPARED,
) -> Effects:
    """``prepared``: what the runtime worked out first (why it cannot take
    the audio now, the session's Opus decoder, a large append's pcm16 decoded
    off the event loop); unprepared, the handler decodes the audio itself."""
    if prepared.refused is not None:
        prepared.refused.event_id = event.event_id
        raise prepared.refused
    state = batch.state
    fmt = append_format(state, event)
    decoded = prepared.decoded
    if isinstance(decoded, ProtocolError):
        raise decoded
    pcm = decoded if decoded is not None else decode_append(event, fmt, prepared.decode_stream)
    duration_ms = pcm16_duration_ms(len(pcm), fmt.sample_rate_hz)
    if state.input.audio_ms + duration_ms > MAX_INPUT_MS:
        raise ProtocolError(
            "input_audio_buffer_full",
            f"the input buffer holds {state.input.audio_ms / 1000:.1f} s; one turn holds at "
            f"most {MAX_INPUT_MS / 60_000:.0f} min: commit or clear it first",
            param="audio",
            event_id=event.event_id,
        )
    if state.input.chunks and state.input.sample_rate_hz != fmt.sample_rate_hz:
        raise ProtocolError(
            "invalid_audio",
            f"sample rate changed from {state.input.sample_rate_hz} to {fmt.sample_rate_hz} Hz "
            "inside one utterance; commit or clear first",
            param="sample_rate_hz",
            event_id=event.event_id,
        )
    end_ms = _declared_timing(state, event, fmt, duration_ms)
    speech = _asked(event, event.speech_named)
    hint = _asked(event, event.hint_named)
    if hint == "barge_in" and not batch.capabilities.supports_barge_in:
        raise ProtocolError(
            "capability_unsupported",
            f"model {facts.model.name!r} does not support barge_in",
            param="overlap_action" if event.overlap_action else "force_barge_in",
            event_id=event.event_id,
        )
    frames = _video_frames(event)
    batch.fact(
        AudioBody(
            pcm=pcm,
            sample_rate_hz=fmt.sample_rate_hz,
            source_format=fmt.name,
            duration_ms=duration_ms,
            audio_end_ms=end_ms,
            is_speech=speech,
            speech_probability=event.speech_probability,
            transcript=event.transcript or None,
            overlap_hint=hint,
        )
    )
    for data in frames:
        batch.fact(FrameBody(data=data, audio_ms=state.input.audio_ms))
    return ()


MAX_VIDEO_FRAMES = 8  # per append


MAX_VIDEO_FRAME_BYTES = 1024 * 1024  # decoded


def _video_frames(event: ce.InputAudioAppend) -> list[bytes]:
    if len(event.video_frames) > MAX_VIDEO_FRAMES:
        raise ProtocolError(
            "invalid_event",
            f"at most {MAX_VIDEO_FRAMES} video frames per append",
            param="video_frames",
            event_id=event.event_id,
        )
    frames = []
    for index, frame in enumerate(event.video_frames):
        param = f"video_frames.{index}"
        encoded = strip_data_url(frame)
        # Strict base64 decodes at ~200 MB/s here: a frame whose text alone
        # proves it too large is refused before paying for the decode.
        if len(encoded) // 4 * 3 - 2 > MAX_VIDEO_FRAME_BYTES:
            raise _frame_too_large(param, event.event_id)
        data = decode_base64(encoded, param=param, event_id=event.event_id)
        if len(data) > MAX_VIDEO_FRAME_BYTES:
            raise _frame_too_large(param, event.event_id)
        frames.append(data)
    return frames


def _frame_too_large(param: str, event_id: str | None) -> ProtocolError:
    return ProtocolError(
        "payload_too_large",
        f"a video frame is at most {MAX_VIDEO_FRAME_BYTES} bytes",
        param=param,
        event_id=event_id,
    )


# One uncommitted turn holds at most this much audio (a monologue is bounded;
# under server VAD silence between turns is trimmed, so only speech counts).
MAX_INPUT_MS = 10 * 60 * 1000.0
