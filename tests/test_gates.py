"""The capability gates: every gated surface, driven through the pure step
against a model that offers nothing, is refused with its code and leaves the
session as it was; a field the model fixed at open is refused alone, the rest
of its update applied; the built-in models offer each surface; and each
model's capabilities say what it really does."""

from __future__ import annotations

import copy

import msgspec
import pytest

from duplex_server.models import build_model
from duplex_server.models.cascade.model import CascadeModel
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import ModelFacts
from duplex_server.sessions.core.effects import StartAnswer
from duplex_server.sessions.core.gates import (
    GATES,
    IMMUTABLE_AFTER_OPEN,
    gates_of,
    immutable_refusals,
    refuse_gated,
)
from duplex_server.sessions.core.model_port import ModelChunk
from duplex_server.sessions.core.pipeline import step
from duplex_server.sessions.core.responses import emit_chunk, finish_response
from duplex_server.sessions.core.state import SessionState, initial_state
from protocol import client_events as ce
from protocol.audio_formats import SUPPORTED_INPUT, SUPPORTED_OUTPUT
from protocol.capabilities import (
    CLIENT_EVENT,
    IMMUTABLE_FIELDS,
    MODEL_NATIVE,
    SERVER_POLICY,
    Capabilities,
)
from protocol.errors import ProtocolError
from tests.wsclient import b64, tone_pcm16

ECHO = build_model("echo")
SCRIPTED = build_model("scripted")


class Lacking:
    """A model that offers no gated surface and fixes every field it may."""

    name = "lacking"
    turn_detection_types: tuple[str, ...] = ()
    streaming = None
    answering = None
    listening = None
    loaded = True
    capabilities = Capabilities(
        implementation_level="test",
        chunk_period_ms=100,
        supports_input_append=False,
        supports_barge_in=False,
        supports_session_resume=False,
        supports_audio_truncate=False,
        supports_multi_session=False,
        input_modes=[],
        input_formats=list(SUPPORTED_INPUT),
        output_formats=list(SUPPORTED_OUTPUT),
        supports_playback_ack=False,
        supports_client_commit=False,
        supports_external_turn_signal=False,
        supports_model_native_turn_policy=False,
        signal_sources=[],
        required_input_modalities=["audio"],
        optional_input_modalities=[],
        supports_image_input=False,
        supports_text_only_turn=False,
        immutable_after_open=list(IMMUTABLE_FIELDS),
    )

    def accepts_voice(self, voice: str) -> bool:
        return True

    def instructions_refusal(self, instructions: str) -> str | None:
        return None


LACKING = Lacking()


def spoken_conversation() -> SessionState:
    """A session (run with echo) whose assistant has spoken, with input
    buffered since: every gated event would be served if it were not gated."""
    state = initial_state("sess_gates0001", ECHO.name, ECHO.turn_detection_types)
    clock = 1000

    def send(event: ce.ClientEvent):
        nonlocal clock
        clock += 10
        return step(state, event, ModelFacts(ECHO), clock)[1]

    send(ce.SessionUpdateEvent(session=ce.SessionUpdate(instructions="be brief", voice="alloy")))
    send(ce.InputAudioAppend(audio=b64(tone_pcm16(200))))
    assert any(isinstance(e, StartAnswer) for e in send(ce.InputAudioCommit()))
    batch = Batch(state, ECHO.capabilities, clock + 5)
    emit_chunk(batch, state.response, ModelChunk(audio=tone_pcm16(100), text="hi"))
    finish_response(batch, "completed")
    send(ce.InputAudioAppend(audio=b64(tone_pcm16(100))))
    return state


def assistant_item(state: SessionState) -> str:
    return next(item.id for item in state.items if item.role == "assistant")


def update(**session: object) -> ce.SessionUpdateEvent:
    return ce.SessionUpdateEvent(session=msgspec.convert(session, ce.SessionUpdate))


# (name, event or a function of the state giving it, code, param)
SURFACES = [
    (
        "resume",
        ce.SessionResume(session_id="sess_gates0001", resume_token="t"),
        "unsupported_session_resume",
        "type",
    ),
    ("append", ce.InputAudioAppend(audio=b64(tone_pcm16(20))), "capability_unsupported", "type"),
    ("text append", ce.InputTextAppend(text="hi"), "native_text_append_unsupported", "type"),
    ("client commit", ce.InputAudioCommit(), "capability_unsupported", "type"),
    ("native commit", ce.InputCommit(), "capability_unsupported", "type"),
    ("external turn signal", ce.TurnSignal(), "capability_unsupported", "type"),
    ("its vLLM-Omni spelling", ce.SignalTurn(), "capability_unsupported", "type"),
    ("pushed text", ce.PushText(text="hi"), "native_text_append_unsupported", "type"),
    ("barge-in", ce.BargeIn(), "capability_unsupported", "type"),
    (
        "truncate",
        lambda state: ce.ItemTruncate(item_id=assistant_item(state), audio_end_ms=50),
        "capability_unsupported",
        "type",
    ),
    ("playback ack", ce.PlaybackAck(played_ms=50), "capability_unsupported", "type"),
    ("its vLLM-Omni spelling", ce.AudioPlaybackAck(played_ms=50), "capability_unsupported", "type"),
]

# A session.update changing a field the model fixed: (name, the update, code, param).
FIXED_FIELDS = [
    ("model", update(model="another"), "model_update_unsupported", "session.model"),
    (
        "voice after audio",
        update(voice="verse"),
        "voice_update_after_audio_unsupported",
        "session.voice",
    ),
    (
        "GA voice after audio",
        update(audio={"output": {"voice": "verse"}}),
        "voice_update_after_audio_unsupported",
        "session.audio.output.voice",
    ),
    (
        "instructions",
        update(instructions="be long"),
        "instructions_update_unsupported",
        "session.instructions",
    ),
    (
        "temperature",
        update(temperature=0.3),
        "temperature_update_unsupported",
        "session.temperature",
    ),
]


def _event(surface, state: SessionState) -> ce.ClientEvent:
    event = surface[1]
    return event(state) if callable(event) else event


@pytest.mark.parametrize("surface", SURFACES, ids=[s[0] for s in SURFACES])
def test_a_gated_surface_is_refused_and_changes_nothing(surface):
    state = spoken_conversation()
    event = _event(surface, state)
    event.event_id = "evt_gated"
    before = copy.deepcopy(state)
    with pytest.raises(ProtocolError) as refused:
        step(state, event, ModelFacts(LACKING), 5000)
    _, _, code, param = surface
    assert (refused.value.code, refused.value.param) == (code, param)
    assert refused.value.event_id == "evt_gated"
    assert state == before


@pytest.mark.parametrize("surface", SURFACES, ids=[s[0] for s in SURFACES])
def test_a_built_in_model_passes_every_gate(surface):
    """Echo offers every gated surface: the same events pass its gates."""
    state = spoken_conversation()
    assert refuse_gated(state, _event(surface, state), ECHO.capabilities) is None


def _sent(batch: Batch) -> list[dict]:
    return [msgspec.json.decode(payload) for _, payload in batch.outbound]


@pytest.mark.parametrize("fixed", FIXED_FIELDS, ids=[f[0] for f in FIXED_FIELDS])
def test_a_fixed_field_is_refused_alone(fixed):
    """The field's refusal names it; the rest of the update applies
    (PROTOCOL.md: one refused field never throws away the rest)."""
    _, event, code, param = fixed
    field = param.rsplit(".", 1)[-1]
    state = spoken_conversation()
    before = msgspec.structs.asdict(state.config)
    patch = msgspec.structs.replace(event.session, speed=1.5, metadata={"k": "v"})
    event = ce.SessionUpdateEvent(session=patch, event_id="evt_fixed")
    batch, _ = step(state, event, ModelFacts(LACKING), 5000)
    error, updated = _sent(batch)
    assert error["type"] == "error" and updated["type"] == "session.updated"
    assert (error["error"]["code"], error["error"]["param"]) == (code, param)
    assert error["error"]["event_id"] == "evt_fixed"
    after = msgspec.structs.asdict(state.config)
    assert (after["speed"], after["metadata"]) == (1.5, {"k": "v"})
    assert after[field] == before[field]
    assert updated["session"]["speed"] == 1.5


@pytest.mark.parametrize("name", ["echo", "gpt-realtime-2.1", "gpt-4o-realtime-preview-2025-06-03"])
def test_a_name_the_model_answers_to_is_no_change(name):
    """The session's own name and OpenAI's realtime names (aliases of the
    served model) change nothing and are not refused; any model fixes its
    model, so echo refuses another name."""
    state = spoken_conversation()
    batch, _ = step(state, update(model=name, speed=1.25), ModelFacts(ECHO), 5000)
    assert [event["type"] for event in _sent(batch)] == ["session.updated"]
    assert (state.config.model, state.config.speed) == ("echo", 1.25)
    batch, _ = step(state, update(model="another"), ModelFacts(ECHO), 5000)
    error, _updated = _sent(batch)
    assert error["error"]["code"] == "model_update_unsupported"


def test_the_table_test_covers_every_gate():
    tested = {type(_event(s, spoken_conversation())) for s in SURFACES}
    assert {f[3].rsplit(".", 1)[-1] for f in FIXED_FIELDS} == set(IMMUTABLE_AFTER_OPEN)
    # every spelling of an event has its gates (a subclass with its own tag)
    assert all(
        gates_of(cls) for cls in ce.CLIENT_EVENT_TYPES.values() if issubclass(cls, tuple(GATES))
    )
    named = {ce.SessionResume, ce.InputAudioCommit, ce.TurnSignal, ce.ItemTruncate, ce.BargeIn}
    assert named <= set(GATES) and set(GATES) <= tested
    assert set(IMMUTABLE_AFTER_OPEN) == set(IMMUTABLE_FIELDS)
    fields = set(Capabilities.__struct_fields__)
    assert all(gate.capability in fields for gates in GATES.values() for gate in gates)


def test_unchanged_values_and_voice_before_audio_pass():
    """Sending a fixed field's current value is no change; a voice is fixed
    only once the assistant has spoken."""
    fresh = initial_state("sess_gates0002", "lacking")
    assert immutable_refusals(fresh, update(voice="verse"), LACKING.capabilities)[1] == []
    spoken = spoken_conversation()
    same = update(model=spoken.config.model, voice="alloy", instructions="be brief")
    assert immutable_refusals(spoken, same, LACKING.capabilities) == (same.session, [])


def test_a_truncating_ack_needs_truncation():
    state = spoken_conversation()
    acks = msgspec.structs.replace(LACKING.capabilities, supports_playback_ack=True)
    assert refuse_gated(state, ce.PlaybackAck(played_ms=50), acks) is None
    refusal = refuse_gated(state, ce.PlaybackAck(played_ms=50, truncate=True), acks)
    assert refusal is not None and (refusal.code, refusal.param) == (
        "capability_unsupported",
        "truncate",
    )


@pytest.mark.parametrize(
    "model",
    [ECHO, SCRIPTED, CascadeModel],
    ids=["echo", "scripted", "cascade"],
)
def test_capabilities_say_what_each_model_does(model):
    caps = model.capabilities
    assert (MODEL_NATIVE in caps.signal_sources) == caps.supports_model_native_turn_policy
    assert caps.supports_model_native_turn_policy == (model.streaming is not None)
    # server_policy: the model has a VAD for server-side turn detection
    assert (SERVER_POLICY in caps.signal_sources) == bool(model.turn_detection_types)
    assert (CLIENT_EVENT in caps.signal_sources) == caps.supports_client_commit
    read = caps.required_input_modalities + caps.optional_input_modalities
    assert caps.supports_text_only_turn == (
        "text" in read and "audio" not in caps.required_input_modalities
    )
    assert not caps.supports_image_input and "video" not in read
    assert set(caps.immutable_after_open) <= set(IMMUTABLE_AFTER_OPEN)
    assert caps.target_barge_in_latency_ms == caps.chunk_period_ms
    wire = msgspec.json.decode(msgspec.json.encode(caps))
    assert {
        "supports_playback_ack",
        "supports_client_commit",
        "supports_external_turn_signal",
        "supports_model_native_turn_policy",
        "signal_sources",
        "session_admission_mode",
        "target_barge_in_latency_ms",
        "required_input_modalities",
        "optional_input_modalities",
        "supports_image_input",
        "supports_text_only_turn",
    } <= set(wire)


def test_a_turn_signal_carries_its_events_own_gates():
    """A signal that is not a barge-in needs no barge-in; the event it
    carries passes that event's gates (a truncate needs truncation)."""
    no_cut = msgspec.structs.replace(
        ECHO.capabilities, supports_barge_in=False, supports_audio_truncate=False
    )
    state = spoken_conversation()
    cancel = ce.TurnSignal(event="input.cancel")
    assert refuse_gated(state, cancel, no_cut) is None
    assert refuse_gated(state, ce.TurnSignal(), no_cut).code == "capability_unsupported"

    class NoTruncation(Lacking):
        capabilities = msgspec.structs.replace(no_cut, supports_external_turn_signal=True)

    truncate = ce.TurnSignal(
        event="conversation.item.truncate",
        payload={"item_id": assistant_item(state), "audio_end_ms": 50},
        event_id="sig",
    )
    before = copy.deepcopy(state)
    with pytest.raises(ProtocolError) as refused:
        step(state, truncate, ModelFacts(NoTruncation()), 5000)
    assert (refused.value.code, refused.value.event_id) == ("capability_unsupported", "sig")
    assert state == before
