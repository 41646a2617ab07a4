"""Config merging (core.config): every wire spelling of a session.update and
of a response.create's overrides, decoded by the real frame decoder."""

from __future__ import annotations

import json
from typing import Any

import pytest
from msgspec import UNSET

from duplex_server.sessions.core.config import (
    SEMANTIC_SILENCE_MS,
    SEMANTIC_VAD_MISSING,
    TURN_DETECTION_DEFAULTS,
    EffectiveConfig,
    merge_config,
    response_config,
    response_output_format,
    with_default_turn_detection,
)
from protocol.audio_formats import AudioFormat
from protocol.client_events import ResponseCreate, ResponseOverrides, SessionUpdateEvent
from protocol.codec import FrameDecoder
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate, Tool, TurnDetection

VAD = ("server_vad", "semantic_vad")  # a model with a VAD and an end-of-turn model (the cascade)
VAD_ONLY = ("server_vad",)  # the cascade where the end-of-turn model is not installed
NO_VAD: tuple[str, ...] = ()  # a model without one (echo)

_decoder = FrameDecoder()


def patch(session: dict[str, Any]) -> SessionUpdate:
    event = _decoder.decode(json.dumps({"type": "session.update", "session": session}))
    assert isinstance(event, SessionUpdateEvent)
    return event.session


def overrides(response: dict[str, Any]) -> ResponseOverrides:
    event = _decoder.decode(json.dumps({"type": "response.create", "response": response}))
    assert isinstance(event, ResponseCreate) and event.response is not None
    return event.response


def merged(
    session: dict[str, Any],
    config: EffectiveConfig | None = None,
    types: tuple[str, ...] = VAD,
) -> EffectiveConfig:
    return merge_config(config or EffectiveConfig(model="m"), patch(session), types)


def refusal(session: dict[str, Any], types: tuple[str, ...] = VAD) -> ProtocolError:
    with pytest.raises(ProtocolError) as err:
        merged(session, types=types)
    return err.value


# -- an empty patch -----------------------------------------------------------


def test_an_empty_patch_changes_nothing():
    config = merged(
        {
            "instructions": "be brief",
            "voice": "alloy",
            "input_audio_format": "g711_ulaw",
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 800},
            "extra_body": {"auto_response": False},
        }
    )
    assert merge_config(config, patch({}), VAD) == config


# -- formats and rates ----------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("pcm16", AudioFormat("pcm16", 24_000)),
        ("pcm_s16le", AudioFormat("pcm16", 24_000)),
        ("g711_ulaw", AudioFormat("g711_ulaw", 8_000)),
        ("g711_alaw", AudioFormat("g711_alaw", 8_000)),
        ("pcm_f32le", AudioFormat("pcm_f32le", 24_000)),
        ("opus", AudioFormat("opus", 48_000)),
    ],
)
def test_beta_input_format_strings(spelling, expected):
    assert merged({"input_audio_format": spelling}).input_format == expected


def test_beta_output_format_string():
    config = merged({"output_audio_format": "g711_alaw"})
    assert config.output_format == AudioFormat("g711_alaw", 8_000)
    assert config.input_format == AudioFormat("pcm16", 24_000)  # the other side untouched


def test_ga_format_objects():
    config = merged(
        {
            "type": "realtime",
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 16_000}},
                "output": {"format": {"type": "audio/pcmu"}},
            },
        }
    )
    assert config.input_format == AudioFormat("pcm16", 16_000)
    assert config.output_format == AudioFormat("g711_ulaw", 8_000)


def test_vllm_omni_top_level_rate_is_the_input_rate_and_keeps_the_codec():
    start = merged({"input_audio_format": "pcm_f32le"})
    config = merged({"sample_rate_hz": 16_000}, start)
    assert config.input_format == AudioFormat("pcm_f32le", 16_000)
    assert config.output_format == start.output_format


def test_vllm_omni_nested_rates():
    config = merged(
        {"audio": {"input": {"sample_rate_hz": 16_000}, "output": {"sample_rate_hz": 22_050}}}
    )
    assert config.input_format == AudioFormat("pcm16", 16_000)
    assert config.output_format == AudioFormat("pcm16", 22_050)


def test_input_sample_rate_hz():
    config = merged({"input_sample_rate_hz": 16_000, "output_sample_rate_hz": 16_000})
    assert config.input_format == AudioFormat("pcm16", 16_000)
    assert config.output_format == AudioFormat("pcm16", 16_000)


def test_an_explicit_rate_wins_over_the_rate_of_a_ga_format_object():
    config = merged(
        {
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 24_000}, "sample_rate_hz": 16_000}
            }
        }
    )
    assert config.input_format == AudioFormat("pcm16", 16_000)


def test_the_beta_format_wins_when_both_spellings_are_sent():
    config = merged(
        {
            "input_audio_format": "g711_alaw",
            "output_audio_format": "pcm16",
            "audio": {
                "input": {"format": {"type": "audio/pcmu"}},
                "output": {"format": {"type": "audio/pcmu"}},
            },
        }
    )
    assert config.input_format == AudioFormat("g711_alaw", 8_000)
    assert config.output_format == AudioFormat("pcm16", 24_000)


def test_input_rate_precedence_across_three_spellings():
    three = {
        "input_sample_rate_hz": 16_000,
        "sample_rate_hz": 22_050,
        "audio": {"input": {"sample_rate_hz": 44_100}},
    }
    assert merged(three).input_format.sample_rate_hz == 16_000
    del three["input_sample_rate_hz"]
    assert merged(three).input_format.sample_rate_hz == 22_050


def test_output_rate_precedence():
    config = merged(
        {"output_sample_rate_hz": 16_000, "audio": {"output": {"sample_rate_hz": 44_100}}}
    )
    assert config.output_format.sample_rate_hz == 16_000


def test_unsupported_input_format_is_refused_with_its_param():
    err = refusal({"input_audio_format": "mp3"})
    assert (err.code, err.param) == ("invalid_audio", "session.input_audio_format")


def test_an_input_only_format_is_refused_for_output():
    assert merged({"input_audio_format": "pcm_f32le"}).input_format.name == "pcm_f32le"
    err = refusal({"output_audio_format": "pcm_f32le"})
    assert (err.code, err.param) == ("invalid_audio", "session.output_audio_format")


def test_a_ga_format_object_of_an_unknown_type_is_refused():
    err = refusal({"audio": {"output": {"format": {"type": "audio/flac"}}}})
    assert (err.code, err.param) == ("invalid_audio", "session.audio.output.format")


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"input_audio_format": "g711_ulaw", "sample_rate_hz": 16_000}, "input_audio_format"),
        (
            {"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 16_000}}}},
            "audio.input.format",  # the refusal names the spelling the client used
        ),
        ({"input_audio_format": "opus", "input_sample_rate_hz": 24_000}, "input_audio_format"),
    ],
)
def test_a_rate_a_fixed_rate_codec_is_not_defined_at_is_refused(session, param):
    err = refusal(session)
    assert (err.code, err.param) == ("invalid_audio", f"session.{param}")


def test_a_rate_alone_is_checked_against_the_current_codec():
    ulaw = merged({"output_audio_format": "g711_ulaw"})
    with pytest.raises(ProtocolError) as err:
        merge_config(ulaw, patch({"output_sample_rate_hz": 16_000}), VAD)
    assert (err.value.code, err.value.param) == ("invalid_audio", "session.output_sample_rate_hz")


# -- modalities, voice, tokens, extra_body -------------------------------------


def test_output_modalities_win_over_modalities():
    assert merged({"modalities": ["text"]}).modalities == ["text"]
    assert merged({"output_modalities": ["audio"]}).modalities == ["audio"]
    both = merged({"modalities": ["text"], "output_modalities": ["audio"]})
    assert both.modalities == ["audio"]


def test_voice_and_speed_in_both_spellings_top_level_wins():
    ga = merged({"audio": {"output": {"voice": "verse", "speed": 1.25}}})
    assert (ga.voice, ga.speed) == ("verse", 1.25)
    both = merged({"voice": "alloy", "speed": 0.75, "audio": {"output": {"voice": "verse"}}})
    assert (both.voice, both.speed) == ("alloy", 0.75)


def test_max_output_tokens_spellings():
    assert merged({"max_response_output_tokens": 100}).max_output_tokens == 100
    assert merged({"max_output_tokens": 200}).max_output_tokens == 200
    capped = merged({"max_output_tokens": 5})
    assert merged({"max_response_output_tokens": "inf"}, capped).max_output_tokens == "inf"
    both = merged({"max_output_tokens": 200, "max_response_output_tokens": 100})
    assert both.max_output_tokens == 200


def test_scalar_fields_replace_and_absent_ones_stay():
    first = merged(
        {
            "instructions": "be brief",
            "temperature": 0.6,
            "tools": [{"type": "function", "name": "lookup"}],
            "tool_choice": "required",
            "overlap_policy": "listen_only",
            "playback_commit_policy": "commit_all_on_done",
            "idle_timeout_s": 30,
        }
    )
    assert first.instructions == "be brief"
    assert first.temperature == 0.6
    assert first.tools == [Tool(name="lookup")]
    assert (first.tool_choice, first.overlap_policy) == ("required", "listen_only")
    assert first.playback_commit_policy == "commit_all_on_done"
    assert first.idle_timeout_s == 30
    second = merged({"instructions": "be thorough", "idle_timeout_s": None}, first)
    assert second.instructions == "be thorough"
    assert second.idle_timeout_s is None  # null clears it
    assert (second.temperature, second.tools, second.tool_choice) == (
        0.6,
        [Tool(name="lookup")],
        "required",
    )


def test_extra_body_fields():
    config = merged(
        {"extra_body": {"auto_response": False, "force_listen_count": 2, "chunk_delay_ms": 25}}
    )
    assert (config.auto_response, config.force_listen_count, config.chunk_delay_ms) == (
        False,
        2,
        25.0,
    )
    # a later extra_body naming one field leaves the others as they were
    later = merged({"extra_body": {"force_listen_count": 0}}, config)
    assert (later.auto_response, later.force_listen_count, later.chunk_delay_ms) == (
        False,
        0,
        25.0,
    )
    assert merged({"instructions": "x"}, config).auto_response is False


# -- turn detection ------------------------------------------------------------


def test_a_partial_server_vad_patch_is_filled_from_the_defaults():
    config = merged({"turn_detection": {"type": "server_vad", "threshold": 0.7}})
    assert config.turn_detection == TurnDetection(
        type="server_vad", threshold=0.7, prefix_padding_ms=300, silence_duration_ms=500
    )


def test_turn_detection_without_a_type_is_server_vad():
    config = merged({"turn_detection": {"silence_duration_ms": 250}})
    assert config.turn_detection is not None
    assert (config.turn_detection.type, config.turn_detection.silence_duration_ms) == (
        "server_vad",
        250,
    )


def test_a_patch_of_the_same_type_merges_into_the_current_settings():
    first = merged(
        {"turn_detection": {"type": "server_vad", "silence_duration_ms": 800, "threshold": 0.3}}
    )
    second = merged(
        {"turn_detection": {"type": "server_vad", "threshold": 0.6, "create_response": False}},
        first,
    )
    assert second.turn_detection == TurnDetection(
        type="server_vad",
        threshold=0.6,
        prefix_padding_ms=300,
        silence_duration_ms=800,
        create_response=False,
    )


def test_switching_type_starts_from_the_defaults_not_the_old_settings():
    first = merged({"turn_detection": {"type": "server_vad", "threshold": 0.9}})
    switched = merged({"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}, first)
    assert switched.turn_detection == TurnDetection(
        type="semantic_vad",
        threshold=0.5,
        prefix_padding_ms=300,
        silence_duration_ms=200,
        eagerness="high",
    )
    back = merged({"turn_detection": {"type": "server_vad"}}, switched)
    assert back.turn_detection == TURN_DETECTION_DEFAULTS  # no eagerness carried over


@pytest.mark.parametrize(
    ("eagerness", "silence_ms"), [("low", 500), ("medium", 300), ("auto", 300), ("high", 200)]
)
def test_semantic_vad_eagerness_sets_the_silence(eagerness, silence_ms):
    config = merged({"turn_detection": {"type": "semantic_vad", "eagerness": eagerness}})
    assert config.turn_detection is not None
    assert config.turn_detection.type == "semantic_vad"
    assert config.turn_detection.eagerness == eagerness
    assert config.turn_detection.silence_duration_ms == silence_ms
    assert SEMANTIC_SILENCE_MS[eagerness] == silence_ms


def test_semantic_vad_without_eagerness_reports_auto():
    config = merged({"turn_detection": {"type": "semantic_vad"}})
    assert config.turn_detection is not None
    assert config.turn_detection.eagerness == "auto"
    assert config.turn_detection.silence_duration_ms == 300


def test_an_explicit_silence_duration_wins_over_eagerness():
    config = merged(
        {
            "turn_detection": {
                "type": "semantic_vad",
                "eagerness": "low",
                "silence_duration_ms": 300,
            }
        }
    )
    assert config.turn_detection is not None
    assert (config.turn_detection.eagerness, config.turn_detection.silence_duration_ms) == (
        "low",
        300,
    )


def test_a_new_eagerness_on_semantic_vad_changes_the_silence():
    low = merged({"turn_detection": {"type": "semantic_vad", "eagerness": "low"}})
    high = merged({"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}, low)
    assert high.turn_detection is not None
    assert high.turn_detection.silence_duration_ms == 200
    # a semantic_vad patch that names no eagerness keeps the session's
    kept = merged({"turn_detection": {"type": "semantic_vad", "threshold": 0.4}}, low)
    assert kept.turn_detection is not None
    assert (kept.turn_detection.eagerness, kept.turn_detection.silence_duration_ms) == (
        "low",
        500,
    )


def test_null_turn_detection_hands_turns_to_the_model_in_either_spelling():
    on = merged({"turn_detection": {"type": "server_vad"}})
    assert on.turn_detection is not None
    assert merged({"turn_detection": None}, on).turn_detection is None
    assert merged({"audio": {"input": {"turn_detection": None}}}, on).turn_detection is None
    # null is accepted even where the model has no VAD
    assert merged({"turn_detection": None}, types=NO_VAD).turn_detection is None


def test_absent_turn_detection_keeps_the_current_one():
    on = merged({"turn_detection": {"type": "server_vad", "silence_duration_ms": 900}})
    assert merged({"instructions": "x"}, on).turn_detection == on.turn_detection
    # an audio block without turn_detection names none either
    assert merged({"audio": {"input": {"sample_rate_hz": 16_000}}}, on).turn_detection == (
        on.turn_detection
    )


def test_ga_turn_detection_spelling_and_top_level_precedence():
    ga = merged({"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}})
    assert ga.turn_detection is not None and ga.turn_detection.type == "semantic_vad"
    both = merged(
        {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 900},
            "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}},
        }
    )
    assert both.turn_detection is not None
    assert (both.turn_detection.type, both.turn_detection.silence_duration_ms) == (
        "server_vad",
        900,
    )


@pytest.mark.parametrize("kind", ["server_vad", "semantic_vad"])
def test_a_model_without_a_vad_refuses_both_vad_types(kind):
    err = refusal({"turn_detection": {"type": kind}}, types=NO_VAD)
    assert (err.code, err.param) == ("unsupported_turn_detection", "session.turn_detection.type")


def test_an_unknown_turn_detection_type_is_refused_even_with_a_vad():
    err = refusal({"turn_detection": {"type": "oracle_vad"}})
    assert (err.code, err.param) == ("unsupported_turn_detection", "session.turn_detection.type")
    assert "semantic_vad" in err.message  # it says what is offered
    ga = refusal({"audio": {"input": {"turn_detection": {"type": "oracle_vad"}}}})
    assert ga.code == "unsupported_turn_detection"


def test_semantic_vad_without_the_end_of_turn_model_is_refused_saying_why():
    """A VAD without Smart Turn does not serve semantic_vad by silence alone."""
    err = refusal({"turn_detection": {"type": "semantic_vad"}}, types=VAD_ONLY)
    assert (err.code, err.param) == ("unsupported_turn_detection", "session.turn_detection.type")
    assert err.message == SEMANTIC_VAD_MISSING
    assert merged({"turn_detection": {"type": "server_vad"}}, types=VAD_ONLY).turn_detection


def test_an_unknown_eagerness_is_refused_naming_it():
    with pytest.raises(ProtocolError) as err:
        patch({"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}})
    assert (err.value.code, err.value.param) == (
        "invalid_event",
        "session.turn_detection.eagerness",
    )


def test_a_type_the_model_names_itself_is_accepted():
    config = merged({"turn_detection": {"type": "model_vad"}}, types=("model_vad",))
    assert config.turn_detection is not None and config.turn_detection.type == "model_vad"
    err = refusal({"turn_detection": {"type": "semantic_vad"}}, types=("model_vad",))
    assert err.code == "unsupported_turn_detection"


# -- the opening default --------------------------------------------------------


@pytest.mark.parametrize(
    "session",
    [
        {},
        {"instructions": "hi"},
        {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24_000}}}},
        {"audio": {"output": {"voice": "alloy"}}},
    ],
)
def test_the_default_is_server_vad_when_no_spelling_names_turn_detection(session):
    opening = patch(session)
    written = with_default_turn_detection(opening, VAD)
    assert written.turn_detection == TURN_DETECTION_DEFAULTS
    assert opening.turn_detection is UNSET  # the client's patch is not changed
    config = merge_config(EffectiveConfig(model="m"), written, VAD)
    assert config.turn_detection == TURN_DETECTION_DEFAULTS


def test_the_default_is_null_where_the_model_has_no_vad():
    written = with_default_turn_detection(patch({}), NO_VAD)
    assert written.turn_detection is None
    # so merging it never meets a refusal on such a model
    assert merge_config(EffectiveConfig(model="m"), written, NO_VAD).turn_detection is None


@pytest.mark.parametrize(
    "session",
    [
        {"turn_detection": None},
        {"turn_detection": {"type": "semantic_vad"}},
        {"audio": {"input": {"turn_detection": None}}},
        {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.8}}}},
    ],
)
def test_a_named_turn_detection_is_left_as_the_client_sent_it(session):
    opening = patch(session)
    assert with_default_turn_detection(opening, VAD) == opening


# -- response overrides ---------------------------------------------------------


def session_config() -> EffectiveConfig:
    return merged(
        {
            "voice": "alloy",
            "instructions": "session",
            "temperature": 0.7,
            "output_audio_format": "pcm16",
            "tools": [{"name": "lookup"}],
            "max_output_tokens": 300,
        }
    )


SESSION_OUT = AudioFormat("pcm16", 24_000)


def test_no_overrides_is_the_session_config():
    config = session_config()
    assert response_config(config, None) is config
    assert response_output_format(None, config.output_format) is config.output_format


def test_overrides_apply_to_one_response_only():
    config = session_config()
    one = response_config(
        config,
        overrides(
            {
                "voice": "verse",
                "instructions": "answer",
                "temperature": 1.1,
                "tools": [],
                "tool_choice": "none",
                "max_response_output_tokens": 50,
                "output_audio_format": "g711_alaw",
            }
        ),
    )
    assert (one.voice, one.instructions, one.temperature) == ("verse", "answer", 1.1)
    assert (one.tools, one.tool_choice, one.max_output_tokens) == ([], "none", 50)
    assert one.output_format == AudioFormat("g711_alaw", 8_000)
    # the session's own config is untouched
    assert config == session_config()
    assert (config.voice, config.output_format) == ("alloy", AudioFormat("pcm16", 24_000))


def test_overrides_that_name_nothing_keep_the_session_values():
    config = session_config()
    assert response_config(config, overrides({"metadata": {"k": "v"}})) == config


def test_response_max_output_tokens_spelling_wins():
    config = session_config()
    one = response_config(
        config, overrides({"max_output_tokens": 20, "max_response_output_tokens": 10})
    )
    assert one.max_output_tokens == 20


def test_ga_response_audio_output_voice_and_format():
    config = session_config()
    ga = overrides(
        {"audio": {"output": {"voice": "verse", "format": {"type": "audio/pcm", "rate": 16_000}}}}
    )
    assert response_output_format(ga, config.output_format) == AudioFormat("pcm16", 16_000)
    one = response_config(config, ga)
    assert (one.voice, one.output_format) == ("verse", AudioFormat("pcm16", 16_000))


def test_top_level_response_spelling_wins_over_ga():
    both = overrides(
        {
            "voice": "alloy",
            "output_audio_format": "g711_ulaw",
            "audio": {"output": {"voice": "verse", "format": {"type": "audio/pcma"}}},
        }
    )
    assert response_output_format(both, SESSION_OUT) == AudioFormat("g711_ulaw", 8_000)
    assert response_config(session_config(), both).voice == "alloy"


def test_an_unsupported_response_format_is_refused_with_its_param():
    with pytest.raises(ProtocolError) as err:
        response_output_format(overrides({"output_audio_format": "pcm_f32le"}), SESSION_OUT)
    assert (err.value.code, err.value.param) == ("invalid_audio", "response.output_audio_format")
    with pytest.raises(ProtocolError) as ga:
        response_config(
            session_config(), overrides({"audio": {"output": {"format": {"type": "audio/flac"}}}})
        )
    # named as the client spelled it, as session refusals are
    assert ga.value.param == "response.audio.output.format"


def test_response_audio_output_rate_and_speed_apply():
    """vLLM-Omni's audio.output.sample_rate_hz and speed, per response."""
    config = session_config()
    asked = overrides(
        {
            "audio": {
                "output": {"format": {"type": "audio/pcm"}, "sample_rate_hz": 16_000, "speed": 1.5}
            }
        }
    )
    one = response_config(config, asked)
    assert (one.output_format, one.speed) == (AudioFormat("pcm16", 16_000), 1.5)
    rate_only = overrides({"audio": {"output": {"sample_rate_hz": 16_000}}})
    assert response_output_format(rate_only, SESSION_OUT) == AudioFormat("pcm16", 16_000)


def test_a_semantic_vad_update_keeps_the_silence_the_client_set():
    config = merged({"turn_detection": {"type": "semantic_vad", "silence_duration_ms": 900}})
    config = merged({"turn_detection": {"type": "semantic_vad", "threshold": 0.6}}, config)
    assert config.turn_detection is not None
    assert config.turn_detection.silence_duration_ms == 900
    config = merged({"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}, config)
    assert config.turn_detection is not None
    assert config.turn_detection.silence_duration_ms == 500  # a new eagerness sets it anew
