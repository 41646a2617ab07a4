"""Effective session configuration and the pure patch merge.

``merge_config`` runs twice for every ``session.update``: once when the
actor validates the patch (it may raise :class:`ProtocolError`) and again in
the fold, where the same patch is known good.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from duplex_server.sessions.core.turns import EAGERNESS
from protocol.audio_formats import (
    SUPPORTED_INPUT,
    SUPPORTED_OUTPUT,
    AudioFormat,
    resolve_format,
)
from protocol.client_events import ResponseOverrides
from protocol.errors import ProtocolError
from protocol.session_config import (
    AudioConfig,
    AudioInputConfig,
    AudioOutputConfig,
    ExtraBody,
    InputTranscription,
    NoiseReduction,
    OverlapThresholds,
    PromptReference,
    SessionUpdate,
    Tool,
    ToolChoice,
    ToolChoiceFunction,
    TracingConfig,
    Truncation,
    TurnDetection,
)

TURN_DETECTION_DEFAULTS = TurnDetection(
    type="server_vad", threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500
)
# semantic_vad: the server's VAD hears the pauses, an end-of-turn model says
# whether the turn is over; eagerness picks the pause that asks it (turns.py).
SEMANTIC_SILENCE_MS = {name: e.ask_after_ms for name, e in EAGERNESS.items()}
SERVED_BY_SERVER_VAD = ("server_vad", "semantic_vad")
# A model whose VAD runs without the end-of-turn model offers no semantic_vad;
# the refusal says why rather than serving it by silence alone.
SEMANTIC_VAD_MISSING = (
    "turn_detection 'semantic_vad' needs the end-of-turn model (Smart Turn v3.2, shipped "
    "in the pipecat-ai==1.14.0 wheel), which this server does not have: "
    "install it (`make install` does) or use server_vad"
)
# Session fields the server stores and echoes in every session object, and
# otherwise leaves alone (PROTOCOL.md, "Fields, spelling by spelling").
ECHOED_FIELDS = ("tracing", "metadata", "include", "prompt", "truncation", "response_format")


def with_default_turn_detection(
    patch: SessionUpdate, turn_detection_types: tuple[str, ...]
) -> SessionUpdate:
    """The opening patch with OpenAI's default written in when the client
    named no turn detection: server VAD, where the model has it. Written into
    the session's first record, so a refold never depends on this code's
    default (a log from before keeps the default it was opened with)."""
    audio_in = patch.audio.input if isinstance(patch.audio, AudioConfig) else UNSET
    named = patch.turn_detection is not UNSET or (
        isinstance(audio_in, AudioInputConfig) and audio_in.turn_detection is not UNSET
    )
    if named:
        return patch
    default = TURN_DETECTION_DEFAULTS if "server_vad" in turn_detection_types else None
    return msgspec.structs.replace(patch, turn_detection=default)


class EffectiveConfig(msgspec.Struct):
    model: str
    # GA's session.type: "transcription" hears and transcribes, never answers
    # (``transcribes_only``); set by the opening record or an update before
    # the session heard anything, so a refold keeps it.
    session_type: str = "realtime"
    modalities: list[str] = msgspec.field(default_factory=lambda: ["audio", "text"])
    instructions: str = ""
    voice: str = "default"
    input_format: AudioFormat = AudioFormat("pcm16", 24_000)
    output_format: AudioFormat = AudioFormat("pcm16", 24_000)
    turn_detection: TurnDetection | None = None
    input_audio_transcription: InputTranscription | None = None
    tools: list[Tool] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    temperature: float = 0.8
    max_output_tokens: int | str = "inf"
    speed: float = 1.0
    overlap_policy: str = "barge_in_on_speech"
    playback_commit_policy: str = "ack_only"
    idle_timeout_s: float | None = None
    ref_audio: str | None = None
    # extra_body.auto_response as the client set it; None: the endpoint's
    # default (commands.auto_responds).
    auto_response: bool | None = None
    force_listen_count: int = 0
    chunk_delay_ms: float = 0.0
    # Stage metrics in response.done (extra_body.return_stage_metrics).
    return_stage_metrics: bool = True
    # Speech over the assistant (PROTOCOL.md, "Overlap").
    overlap_short_ack_ms: float = 400.0
    overlap_barge_in_ms: float = 400.0
    overlap_silence_rms: float = 0.01
    # Stored and echoed (PROTOCOL.md's field table says what each one does).
    input_audio_noise_reduction: NoiseReduction | None = None
    tracing: str | TracingConfig | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    prompt: PromptReference | None = None
    truncation: Truncation | None = None
    response_format: str | None = None
    # Opened on the plain OpenAI endpoint (not ?duplex=1): OpenAI's semantics
    # where the duplex wire differs, e.g. response.create with no input.
    openai_semantics: bool = False
    # extra_body.duplex_events: the extension events on the OpenAI endpoint too.
    duplex_events: bool = False

    @property
    def sends_extensions(self) -> bool:
        """Whether the session's socket gets the duplex extension events."""
        return not self.openai_semantics or self.duplex_events


def _set(value, fallback):
    return fallback if value is UNSET else value


def _first_set(*values):
    """The first of several spellings of one field that the client sent."""
    return next((value for value in values if value is not UNSET), UNSET)


def _spelled(default: str, *spellings: tuple[object, str]) -> str:
    """The ``param`` a refusal names: the first spelling the client sent."""
    return next((name for value, name in spellings if value is not UNSET), default)


def _turn_detection(
    current: TurnDetection | None, patch: TurnDetection | None, allowed: tuple[str, ...]
) -> TurnDetection | None:
    if patch is None:
        return None
    if patch.type == "semantic_vad" and "server_vad" in allowed and patch.type not in allowed:
        raise ProtocolError(
            "unsupported_turn_detection", SEMANTIC_VAD_MISSING, param="session.turn_detection.type"
        )
    if patch.type not in allowed:
        raise ProtocolError(
            "unsupported_turn_detection",
            f"turn_detection {patch.type!r} is not supported by this model; "
            f"use null (model-owned) or one of: {', '.join(allowed) or 'none'}",
            param="session.turn_detection.type",
        )
    base = current if current is not None and current.type == patch.type else None
    merged = {f: getattr(TURN_DETECTION_DEFAULTS, f) for f in TurnDetection.__struct_fields__}
    if base is not None:
        merged.update({f: getattr(base, f) for f in base.__struct_fields__})
    merged.update(
        {f: getattr(patch, f) for f in patch.__struct_fields__ if getattr(patch, f) is not UNSET}
    )
    if patch.type == "semantic_vad":
        eagerness = merged["eagerness"] if merged["eagerness"] is not UNSET else "auto"
        merged["eagerness"] = eagerness
        # eagerness sets the silence, unless the client set one (now or before)
        if patch.silence_duration_ms is UNSET and (base is None or patch.eagerness is not UNSET):
            merged["silence_duration_ms"] = SEMANTIC_SILENCE_MS[eagerness]
    return TurnDetection(**merged)


def merge_config(
    config: EffectiveConfig, patch: SessionUpdate, turn_detection_types: tuple[str, ...]
) -> EffectiveConfig:
    audio_in: AudioInputConfig | UnsetType = UNSET
    audio_out: AudioOutputConfig | UnsetType = UNSET
    if not isinstance(patch.audio, UnsetType):
        audio_in, audio_out = patch.audio.input, patch.audio.output
    input_spec = _set(patch.input_audio_format, UNSET)
    if input_spec is UNSET and isinstance(audio_in, AudioInputConfig):
        input_spec = audio_in.format
    output_spec = _set(patch.output_audio_format, UNSET)
    if output_spec is UNSET and isinstance(audio_out, AudioOutputConfig):
        output_spec = audio_out.format
    turn_patch = patch.turn_detection
    if turn_patch is UNSET and isinstance(audio_in, AudioInputConfig):
        turn_patch = audio_in.turn_detection
    transcription = patch.input_audio_transcription
    if transcription is UNSET and isinstance(audio_in, AudioInputConfig):
        transcription = audio_in.transcription
    noise_reduction = patch.input_audio_noise_reduction
    if noise_reduction is UNSET and isinstance(audio_in, AudioInputConfig):
        noise_reduction = audio_in.noise_reduction
    input_rate = _first_set(
        patch.input_sample_rate_hz,
        patch.sample_rate_hz,
        patch.sample_rate,
        audio_in.sample_rate_hz if audio_in is not UNSET else UNSET,
    )
    output_rate = _first_set(
        patch.output_sample_rate_hz,
        audio_out.sample_rate_hz if audio_out is not UNSET else UNSET,
    )
    in_fields = audio_in if isinstance(audio_in, AudioInputConfig) else AudioInputConfig()
    out_fields = audio_out if isinstance(audio_out, AudioOutputConfig) else AudioOutputConfig()
    input_param = _spelled(
        "session.input_audio_format",
        (patch.input_audio_format, "session.input_audio_format"),
        (in_fields.format, "session.audio.input.format"),
        (patch.input_sample_rate_hz, "session.input_sample_rate_hz"),
        (patch.sample_rate_hz, "session.sample_rate_hz"),
        (patch.sample_rate, "session.sample_rate"),
        (in_fields.sample_rate_hz, "session.audio.input.sample_rate_hz"),
    )
    output_param = _spelled(
        "session.output_audio_format",
        (patch.output_audio_format, "session.output_audio_format"),
        (out_fields.format, "session.audio.output.format"),
        (patch.output_sample_rate_hz, "session.output_sample_rate_hz"),
        (out_fields.sample_rate_hz, "session.audio.output.sample_rate_hz"),
    )
    voice = _set(patch.voice, UNSET)
    speed = _set(patch.speed, UNSET)
    if audio_out is not UNSET:
        voice = _set(voice, audio_out.voice)
        speed = _set(speed, audio_out.speed)
    extra = patch.extra_body if isinstance(patch.extra_body, ExtraBody) else ExtraBody()
    if UNSET not in (patch.tools, extra.realtime_tools) and patch.tools != extra.realtime_tools:
        raise ProtocolError(
            "invalid_event",
            "extra_body.realtime_tools contradicts tools: send the session's tools once",
            param="session.extra_body.realtime_tools",
        )
    tools = list(_set(_first_set(patch.tools, extra.realtime_tools), config.tools))
    tool_choice = _set(patch.tool_choice, config.tool_choice)
    check_tool_choice(tool_choice, tools, "session.tool_choice")
    return msgspec.structs.replace(
        config,
        model=_set(patch.model, config.model),
        session_type=_set(patch.type, config.session_type),
        modalities=list(_set(patch.output_modalities, _set(patch.modalities, config.modalities))),
        instructions=_set(patch.instructions, config.instructions),
        voice=_set(voice, config.voice),
        input_format=_format(
            input_spec,
            input_rate,
            config.input_format,
            input_param,
            SUPPORTED_INPUT,
        ),
        output_format=_format(
            output_spec,
            output_rate,
            config.output_format,
            output_param,
            SUPPORTED_OUTPUT,
        ),
        turn_detection=(
            config.turn_detection
            if turn_patch is UNSET
            else _turn_detection(config.turn_detection, turn_patch, turn_detection_types)
        ),
        input_audio_transcription=_set(transcription, config.input_audio_transcription),
        tools=tools,
        tool_choice=tool_choice,
        temperature=_set(patch.temperature, config.temperature),
        max_output_tokens=_set(
            _first_set(patch.max_output_tokens, patch.max_response_output_tokens, patch.max_tokens),
            config.max_output_tokens,
        ),
        speed=_set(speed, config.speed),
        overlap_policy=_set(patch.overlap_policy, config.overlap_policy),
        playback_commit_policy=_set(patch.playback_commit_policy, config.playback_commit_policy),
        idle_timeout_s=_set(patch.idle_timeout_s, config.idle_timeout_s),
        ref_audio=_set(patch.ref_audio, config.ref_audio),
        auto_response=_set(extra.auto_response, config.auto_response),
        force_listen_count=_set(extra.force_listen_count, config.force_listen_count),
        chunk_delay_ms=_set(extra.chunk_delay_ms, config.chunk_delay_ms),
        return_stage_metrics=_set(extra.return_stage_metrics, config.return_stage_metrics),
        duplex_events=_set(extra.duplex_events, config.duplex_events),
        # the overlap thresholds, top level or under extra_body (top level wins)
        **{
            name: _set(
                _first_set(getattr(patch, name), getattr(extra, name)), getattr(config, name)
            )
            for name in OverlapThresholds.__struct_fields__
        },
        input_audio_noise_reduction=_set(noise_reduction, config.input_audio_noise_reduction),
        **{name: _set(getattr(patch, name), getattr(config, name)) for name in ECHOED_FIELDS},
    )


def check_tool_choice(choice: ToolChoice, tools: list[Tool], param: str) -> None:
    """A tool_choice naming a function must name one of the tools offered;
    ``required`` needs a tool to call (without one it could not be honoured)."""
    if choice == "required" and not tools:
        raise ProtocolError(
            "invalid_value", "tool_choice 'required' needs at least one tool", param=param
        )
    if not isinstance(choice, ToolChoiceFunction):
        return
    name = choice.function_name()
    if name is None:
        raise ProtocolError(
            "invalid_event", "tool_choice of type function needs a name", param=f"{param}.name"
        )
    if name not in {tool.name for tool in tools}:
        raise ProtocolError(
            "invalid_value",
            f"tool_choice names {name!r}, which is not among the tools offered",
            param=f"{param}.name",
        )


def response_config(
    config: EffectiveConfig, overrides: ResponseOverrides | None
) -> EffectiveConfig:
    """The configuration one response is generated under: the session's, with
    that response.create's overrides (voice, instructions, sampling, tools)."""
    if overrides is None:
        return config
    return msgspec.structs.replace(
        config,
        voice=_set(overrides.voice_named(), config.voice),
        speed=_set(overrides.speed_named(), config.speed),
        output_format=response_output_format(overrides, config.output_format),
        instructions=_set(overrides.instructions, config.instructions),
        temperature=_set(overrides.temperature, config.temperature),
        max_output_tokens=_set(
            overrides.max_output_tokens,
            _set(overrides.max_response_output_tokens, config.max_output_tokens),
        ),
        tools=list(_set(overrides.tools, config.tools)),
        tool_choice=_set(overrides.tool_choice, config.tool_choice),
    )


def check_response_tool_choice(config: EffectiveConfig, overrides: ResponseOverrides) -> None:
    check_tool_choice(
        _set(overrides.tool_choice, config.tool_choice),
        list(_set(overrides.tools, config.tools)),
        "response.tool_choice",
    )


def response_output_format(
    overrides: ResponseOverrides | None, current: AudioFormat
) -> AudioFormat:
    """The output format of one response: what its response.create asked
    for (a format, a rate, or both), else the session's ``current`` one."""
    if overrides is None:
        return current
    out = overrides.audio_output()
    param = _spelled(
        "response.output_audio_format",
        (overrides.output_audio_format, "response.output_audio_format"),
        (out.format, "response.audio.output.format"),
        (out.sample_rate_hz, "response.audio.output.sample_rate_hz"),
    )
    return _format(
        overrides.format_named(), overrides.rate_named(), current, param, SUPPORTED_OUTPUT
    )


def _format(spec, rate, current: AudioFormat, param: str, supported) -> AudioFormat:
    if spec is UNSET and rate is UNSET:
        return current
    if spec is UNSET:
        spec = current.name
    return resolve_format(
        spec, param=param, supported=supported, rate_hz=None if rate is UNSET else rate
    )


# --- what the config says a session does ------------------------------------


def transcribes_only(config: EffectiveConfig) -> bool:
    """A transcription session (GA ``type: "transcription"``, beta
    ``?intent=transcription``): turns are heard, committed and transcribed;
    nothing ever answers them."""
    return config.session_type == "transcription"


def auto_responds(config: EffectiveConfig) -> bool:
    """Whether a client's commit that does not say starts an answer:
    ``extra_body.auto_response`` where the client set it; else on the OpenAI
    endpoint never (OpenAI: a commit asks for no answer, the client's
    ``response.create`` does), on the duplex wire always (its clients commit
    and expect the answer). A transcription session never answers."""
    if transcribes_only(config):
        return False
    if config.auto_response is not None:
        return config.auto_response
    return not config.openai_semantics


def vad_responds(config: EffectiveConfig, create_response: bool | None) -> bool:
    """Whether a turn the server's VAD ended is answered: the turn
    detection's ``create_response`` (OpenAI's default: true), else
    ``extra_body.auto_response`` where the client set it. A transcription
    session never answers, whatever its turn detection says."""
    if transcribes_only(config):
        return False
    if create_response is not None:
        return create_response
    return config.auto_response is not False


def transcript_deltas_add_up(config: EffectiveConfig) -> bool:
    """Whether partial transcripts are told as deltas that add up to the
    completed transcript (OpenAI's rule), not as the duplex wire's live
    captions that the final replaces: on the OpenAI endpoint, and for a
    transcription session on either endpoint (the transcript is its product,
    and its clients append the deltas)."""
    return config.openai_semantics or transcribes_only(config)


def tells_transcripts(config: EffectiveConfig) -> bool:
    """Whether the client is told what recognition heard. OpenAI sends
    transcription events only while ``input_audio_transcription`` is set;
    the duplex wire always tells (its clients show the user's words), and a
    transcription session is there to tell them."""
    return (
        config.input_audio_transcription is not None
        or not config.openai_semantics
        or transcribes_only(config)
    )
