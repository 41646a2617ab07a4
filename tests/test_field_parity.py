"""Every spelling a client may send (OpenAI's, vLLM-Omni's, ours) is honoured
or refused with a code, never dropped: a table per surface, each row a frame
as a client sends it, decoded by the same gate the server uses and stepped
through the pure session core."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from duplex_server.models import build_model
from duplex_server.sessions.core.commands import ModelFacts
from duplex_server.sessions.core.config import EffectiveConfig, merge_config
from duplex_server.sessions.core.effects import Close, StartAnswer, StopAnswer
from duplex_server.sessions.core.items import to_wire
from duplex_server.sessions.core.pipeline import step
from duplex_server.sessions.core.records import AudioBody, CloseBody
from duplex_server.sessions.core.state import initial_state
from duplex_server.sessions.core.turns import MIN_SPEECH_MS, VadGate
from protocol import client_events as ce
from protocol.codec import FrameDecoder
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate, TurnDetection
from tests.wsclient import b64

MODEL = build_model("echo")


class Session:
    """One session driven through the decoder and the pure step; what it
    journaled, decoded."""

    def __init__(self) -> None:
        self.state = initial_state("sess_parity01", MODEL.name, MODEL.turn_detection_types)
        self.decoder = FrameDecoder()
        self.clock = 1_000
        self.records: list = []
        self.events: list[dict[str, Any]] = []

    def send(self, event: dict[str, Any]):
        self.clock += 10
        batch, effects = step(
            self.state, self.decoder.decode(json.dumps(event)), ModelFacts(MODEL), self.clock
        )
        self.records += batch.records
        self.events += [json.loads(payload) for _, payload in batch.outbound]
        return effects

    def refused(self, event: dict[str, Any]) -> ProtocolError:
        before = self.state.last_seq
        with pytest.raises(ProtocolError) as refusal:
            self.send(event)
        assert self.state.last_seq == before  # a refusal adds nothing
        return refusal.value

    def update(self, session: dict[str, Any]) -> dict[str, Any]:
        self.send({"type": "session.update", "session": session})
        return self.events[-1]["session"]


def pcm16(ms: float, rate: int) -> bytes:
    samples = int(rate * ms / 1000)
    return b"".join(
        int(8000 * math.sin(2 * math.pi * 440 * i / rate)).to_bytes(2, "little", signed=True)
        for i in range(samples)
    )


# --- session fields ----------------------------------------------------------

RATE_SPELLINGS = [
    ({"sample_rate_hz": 16_000}, "input", 16_000),
    ({"sample_rate": 16_000}, "input", 16_000),
    ({"audio": {"input": {"sample_rate_hz": 16_000}}}, "input", 16_000),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16_000}}}}, "input", 16_000),
    ({"audio": {"output": {"sample_rate_hz": 22_050}}}, "output", 22_050),
    ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 22_050}}}}, "output", 22_050),
]


@pytest.mark.parametrize(("patch", "side", "rate"), RATE_SPELLINGS)
def test_every_rate_spelling_is_the_rate_served(patch, side, rate):
    session = Session()
    announced = session.update(patch)
    assert announced["duplex"][f"{side}_format"]["rate"] == rate
    fmt = (
        session.state.config.input_format if side == "input" else session.state.config.output_format
    )
    assert fmt.sample_rate_hz == rate


def test_a_rate_the_server_cannot_serve_names_the_field():
    error = Session().refused({"type": "session.update", "session": {"sample_rate": 7}})
    assert (error.code, error.param) == ("invalid_audio", "session.sample_rate")


@pytest.mark.parametrize(
    "spelling", ["max_tokens", "max_output_tokens", "max_response_output_tokens"]
)
def test_every_token_limit_spelling_is_the_limit(spelling):
    announced = Session().update({spelling: 64})
    assert announced["max_response_output_tokens"] == 64


TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "name": "lookup"}],
)
def test_tool_choice_as_a_string_or_an_object_is_kept(choice):
    announced = Session().update({"tools": TOOLS, "tool_choice": choice})
    assert announced["tool_choice"] == choice


def test_the_chat_spelling_of_a_named_function_is_kept():
    choice = {"type": "function", "function": {"name": "lookup"}}
    announced = Session().update({"tools": TOOLS, "tool_choice": choice})
    assert announced["tool_choice"] == choice


def test_a_tool_choice_naming_no_offered_tool_is_refused():
    session = Session()
    error = session.refused(
        {"type": "session.update", "session": {"tool_choice": {"type": "function", "name": "x"}}}
    )
    assert (error.code, error.param) == ("invalid_value", "session.tool_choice.name")


STORED_AND_ECHOED = {
    "input_audio_noise_reduction": {"type": "near_field"},
    "tracing": {"workflow_name": "support", "group_id": "g1"},
    "metadata": {"customer": "c-42"},
    "include": ["item.input_audio_transcription.logprobs"],
    "prompt": {"id": "pmpt_1", "version": "3", "variables": {"city": "Paris"}},
    "response_format": "pcm16",
    "truncation": {"type": "retention_ratio", "retention_ratio": 0.8},
}


@pytest.mark.parametrize(("field", "value"), list(STORED_AND_ECHOED.items()))
def test_stored_fields_are_echoed_and_survive_a_refold(field, value):
    session = Session()
    assert session.update({field: value})[field] == value
    assert session.update({"instructions": "later"})[field] == value  # kept across updates


def test_the_ga_spelling_of_noise_reduction_is_the_same_setting():
    announced = Session().update({"audio": {"input": {"noise_reduction": {"type": "far_field"}}}})
    assert announced["input_audio_noise_reduction"] == {"type": "far_field"}
    assert announced["audio"]["input"]["noise_reduction"] == {"type": "far_field"}


def test_metadata_beyond_openai_bounds_is_refused():
    error = Session().refused(
        {"type": "session.update", "session": {"metadata": {str(i): "v" for i in range(17)}}}
    )
    assert (error.code, error.param) == ("invalid_event", "session.metadata")


def test_an_unknown_key_inside_turn_detection_is_refused_by_name():
    session = Session()
    error = session.refused(
        {"type": "session.update", "session": {"turn_detection": {"type": "server_vad", "sens": 1}}}
    )
    assert (error.code, error.param) == ("invalid_event", "session.turn_detection.sens")


def test_openais_idle_timeout_is_served():
    """Honoured under server VAD (runtime/idle_timer.py; tests/test_idle_timer.py)."""
    vad = ("server_vad",)
    config = EffectiveConfig(model="m")
    served = merge_config(
        config, SessionUpdate(turn_detection=TurnDetection(idle_timeout_ms=None)), vad
    )
    assert served.turn_detection is not None and served.turn_detection.idle_timeout_ms is None
    served = merge_config(
        config, SessionUpdate(turn_detection=TurnDetection(idle_timeout_ms=5000)), vad
    )
    assert served.turn_detection is not None and served.turn_detection.idle_timeout_ms == 5000


def test_unknown_top_level_fields_stay_tolerated():
    announced = Session().update({"instructions": "hi", "x_future_field": {"a": 1}})
    assert announced["instructions"] == "hi"


def test_min_speech_duration_sets_the_shortest_turn():
    settings = TurnDetection(threshold=0.5, silence_duration_ms=200, min_speech_duration_ms=300)
    gate = VadGate(settings, window_ms=32.0)
    assert gate.min_speech_ms == 300.0
    started = [t for end in range(32, 352, 32) for t in gate.push(float(end), 0.9)]
    assert [t.kind for t in started] == ["speech_started"]
    assert started[0].at_ms == 0.0  # dated from where the speech began
    assert VadGate(TurnDetection(threshold=0.5, silence_duration_ms=200), 32.0).min_speech_ms == (
        MIN_SPEECH_MS
    )


# --- appends -------------------------------------------------------------------


def append(pcm: bytes, **fields: Any) -> dict[str, Any]:
    return {"type": "input_audio_buffer.append", "audio": b64(pcm), **fields}


@pytest.mark.parametrize(
    "fields",
    [
        {"format": "pcm16", "sample_rate_hz": 16_000},
        {"input_audio_format": "pcm16", "sample_rate": 16_000},
        {"format": "pcm16", "input_audio_format": "pcm16", "sample_rate_hz": 16_000},
    ],
)
def test_append_format_spellings(fields):
    session = Session()
    session.send(append(pcm16(100, 16_000), duration_ms=100.0, **fields))
    audio = session.records[-1].body
    assert isinstance(audio, AudioBody)
    assert (audio.sample_rate_hz, audio.duration_ms) == (16_000, 100.0)


def test_spellings_that_contradict_each_other_are_refused():
    error = Session().refused(
        append(pcm16(100, 16_000), sample_rate_hz=16_000, sample_rate=24_000, event_id="e1")
    )
    assert (error.code, error.param, error.event_id) == ("invalid_event", "sample_rate", "e1")


@pytest.mark.parametrize("spelling", ["duration_ms", "audio_duration_ms"])
def test_a_declared_duration_the_audio_contradicts_is_refused(spelling):
    """The corruption the parity issue found: 16 kHz audio read as 24 kHz
    lasts two thirds of what the client declared; the server says so."""
    error = Session().refused(append(pcm16(100, 16_000), **{spelling: 100.0}))
    assert (error.code, error.param) == ("invalid_audio", spelling)
    assert "24000 Hz" in error.message


def test_audio_start_sets_the_chunk_end_and_must_agree_with_its_end():
    session = Session()
    session.send(append(pcm16(100, 24_000), audio_start_ms=500.0))
    assert session.records[-1].body.audio_end_ms == 600.0
    assert session.state.input.end_ms == 600.0
    error = session.refused(append(pcm16(100, 24_000), audio_start_ms=600.0, audio_end_ms=900.0))
    assert (error.code, error.param) == ("invalid_audio", "audio_start_ms")


@pytest.mark.parametrize(
    ("fields", "speech"),
    [
        ({"is_speech": True}, True),
        ({"speech": False}, False),
        ({"speech_probability": 0.9}, True),
        ({"speech_probability": 0.1}, False),
        ({"speech": True, "speech_probability": 0.1}, True),  # the flag wins over the score
        ({}, None),
    ],
)
def test_speech_hints_are_logged(fields, speech):
    session = Session()
    session.send(append(pcm16(100, 24_000), **fields))
    body = session.records[-1].body
    assert body.is_speech is speech
    assert body.speech_probability == fields.get("speech_probability")


def test_the_clients_transcript_is_the_turns_transcript():
    session = Session()
    session.send(append(pcm16(100, 24_000), transcript="what time "))
    session.send(append(pcm16(100, 24_000), transcript="is it"))
    session.send({"type": "input_audio_buffer.commit", "response_create": False})
    assert session.state.items[-1].parts[0].transcript == "what time is it"
    heard = [e for e in session.events if e["type"].endswith("transcription.completed")]
    assert heard[-1]["transcript"] == "what time is it"


@pytest.mark.parametrize("spelling", ["response_create", "create_response"])
def test_both_spellings_of_deferring_the_answer(spelling):
    session = Session()
    session.send(append(pcm16(100, 24_000)))
    effects = session.send({"type": "input_audio_buffer.commit", spelling: False})
    assert not any(isinstance(e, StartAnswer) for e in effects)
    committed = next(e for e in session.events if e["type"] == "input_audio_buffer.committed")
    assert committed["event"]["response_create_deferred"] is True


# --- client event spellings ----------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "base"),
    [
        ("input_text.append", ce.InputTextAppend),
        ("push_text", ce.InputTextAppend),
        ("signal_turn", ce.TurnSignal),
        ("audio.playback_ack", ce.PlaybackAck),
        ("close_session", ce.SessionClose),
        ("close", ce.SessionClose),
        ("input.commit", ce.InputAudioCommit),
    ],
)
def test_every_alias_decodes_to_the_event_it_spells(alias, base):
    assert isinstance(FrameDecoder().decode(json.dumps({"type": alias})), base)


def test_text_aliases_append_text():
    session = Session()
    session.send({"type": "input_text.append", "text": "hello "})
    session.send({"type": "push_text", "text": "there"})
    assert session.state.input.text == "hello there"


@pytest.mark.parametrize("alias", ["session.close", "close_session", "close"])
def test_close_spellings_close_with_the_clients_reason(alias):
    session = Session()
    effects = session.send({"type": alias, "reason": "user hung up"})
    assert Close() in effects
    closed = session.events[-1]
    assert (closed["type"], closed["reason"], closed["detail"]) == (
        "session.closed",
        "client_close",
        "user hung up",
    )
    assert isinstance(session.records[-1].body, CloseBody)
    assert session.records[-1].body.detail == "user hung up"


def speaking() -> Session:
    session = Session()
    session.send(append(pcm16(200, 24_000)))
    assert any(
        isinstance(e, StartAnswer) for e in session.send({"type": "input_audio_buffer.commit"})
    )
    return session


@pytest.mark.parametrize("signal", ["turn.signal", "signal_turn"])
def test_turn_signal_barge_in(signal):
    session = speaking()
    epoch = session.state.epoch
    effects = session.send({"type": signal, "event": "barge_in"})
    assert any(isinstance(e, StopAnswer) for e in effects) and session.state.epoch == epoch + 1
    assert session.state.response is None


def test_turn_signal_applies_the_event_it_names_with_its_payload():
    session = speaking()
    session.send({"type": "turn.signal", "event": "response.cancel", "payload": {}})
    assert session.state.response is None
    session.send(
        {"type": "turn.signal", "event": "session.update", "payload": {"session": {"voice": "b"}}}
    )
    assert session.state.config.voice == "b"
    session.send({"type": "turn.signal", "event": "input.cancel"})
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    session.send(
        {"type": "turn.signal", "event": "conversation.item.create", "payload": {"item": item}}
    )
    created = session.state.items[-1].id
    session.send(
        {
            "type": "turn.signal",
            "event": "conversation.item.delete",
            "payload": {"item_id": created},
        }
    )
    assert all(i.id != created for i in session.state.items)


def test_a_turn_signal_payload_is_validated_as_its_event():
    error = speaking().refused(
        {
            "type": "turn.signal",
            "event": "conversation.item.truncate",
            "payload": {"item_id": 5},
            "event_id": "s1",
        }
    )
    assert (error.code, error.param, error.event_id) == ("invalid_event", "payload.item_id", "s1")


def test_a_turn_signal_for_an_event_it_cannot_carry_is_refused():
    error = Session().refused({"type": "turn.signal", "event": "input_audio_buffer.append"})
    assert (error.code, error.param) == ("invalid_event", "event")


def test_output_clear_names_the_response_it_cuts():
    session = speaking()
    error = session.refused({"type": "output_audio_buffer.clear", "response_id": "resp_nope"})
    assert (error.code, error.param) == ("response_not_found", "response_id")
    active = session.state.response.id
    session.send({"type": "output_audio_buffer.clear", "response_id": active})
    assert session.state.response is None
    cleared = next(e for e in session.events if e["type"] == "output_audio_buffer.cleared")
    assert cleared["response_id"] == active


def test_an_input_image_keeps_its_url():
    session = Session()
    image = {
        "type": "input_image",
        "image_url": "data:image/png;base64,iVBORw0KGgo=",
        "detail": "low",
    }
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "see"}, image],
    }
    session.send({"type": "conversation.item.create", "item": item})
    wire = to_wire(session.state.items[-1])
    assert wire.content[1].image_url == image["image_url"]
    assert wire.content[1].detail == "low"
    error = session.refused(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_image"}]},
        }
    )
    assert (error.code, error.param) == ("invalid_event", "item.content.0.image_url")


def test_a_playback_ack_alias_acknowledges():
    session = speaking()
    response = session.state.response.id
    session.send({"type": "audio.playback_ack", "played_ms": 0.0, "response_id": response})
    assert session.events[-1]["type"] == "playback.acknowledged"
