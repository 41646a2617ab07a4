"""Which client events need which capability, and what an open session may
not change: the gates, as tables.

``GATES`` maps a client event type to the capabilities it needs; a model
that lacks one has the event refused with the gate's code before any
handler runs (``pipeline.admit`` calls :func:`refuse_gated`), so a refused
event adds nothing to the session. ``session.resume`` never reaches the
step (the manager serves it), so the manager asks :func:`refuse_unsupported`.
``IMMUTABLE_AFTER_OPEN`` says how a ``session.update`` changes each field a
model may declare fixed (``Capabilities.immutable_after_open``), what
refusing it is called, and how the field is taken out of the update (the
rest of it applies). Everything here is pure: the state, the event and the
capabilities in, an error or None out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET

from duplex_server.sessions.core.model_names import ModelNames
from duplex_server.sessions.core.state import SessionState
from protocol import client_events as ce
from protocol.capabilities import Capabilities
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate


@dataclass(frozen=True)
class Gate:
    """An event needs ``capability`` (a :class:`Capabilities` field: true, or
    holding ``needs`` when it is a list); refused with ``code`` and ``param``.
    ``when``: only events it says yes to are gated (None: all of the type)."""

    capability: str
    code: str = "capability_unsupported"
    param: str = "type"
    needs: str | None = None
    when: Callable[[Any], bool] | None = None

    def offered(self, capabilities: Capabilities) -> bool:
        value = getattr(capabilities, self.capability)
        return self.needs in value if self.needs is not None else bool(value)


def _truncates(event: ce.PlaybackAck) -> bool:
    return event.truncate


def _signals_barge_in(event: ce.TurnSignal) -> bool:
    return event.event == "barge_in"


# Keyed by the event a class spells: another spelling (a subclass with its
# own tag: input.commit, signal_turn, audio.playback_ack, ...) has the gates
# of the event it spells (gates_of).
GATES: dict[type[ce.ClientEvent], tuple[Gate, ...]] = {
    ce.SessionResume: (Gate("supports_session_resume", "unsupported_session_resume"),),
    ce.InputAudioAppend: (Gate("supports_input_append"),),
    ce.InputTextAppend: (Gate("input_modes", "native_text_append_unsupported", needs="text"),),
    ce.InputAudioCommit: (Gate("supports_client_commit"),),
    # An external turn signal; one that cuts the answer needs barge-in too
    # (the other events it may carry pass their own gates: commands.turn_signal).
    ce.TurnSignal: (
        Gate("supports_external_turn_signal"),
        Gate("supports_barge_in", when=_signals_barge_in),
    ),
    ce.BargeIn: (Gate("supports_barge_in"),),
    ce.ItemTruncate: (Gate("supports_audio_truncate"),),
    ce.PlaybackAck: (
        Gate("supports_playback_ack"),
        Gate("supports_audio_truncate", param="truncate", when=_truncates),
    ),
}


def gates_of(event_type: type[ce.ClientEvent]) -> tuple[Gate, ...]:
    """The gates of an event type, or of the event it is another spelling of."""
    return next((GATES[base] for base in event_type.__mro__ if base in GATES), ())


def refuse_unsupported(event: ce.ClientEvent, capabilities: Capabilities) -> ProtocolError | None:
    """The refusal of ``event`` if it needs a capability the model lacks."""
    for gate in gates_of(type(event)):
        if gate.when is not None and not gate.when(event):
            continue
        if not gate.offered(capabilities):
            tag = type(event).__struct_config__.tag
            what = f"{gate.capability} with {gate.needs!r}" if gate.needs else gate.capability
            return ProtocolError(
                gate.code,
                f"this model does not support {tag} (capabilities.{what} is not offered)",
                param=gate.param,
                event_id=event.event_id,
            )
    return None


# --- fields fixed once the session is open -----------------------------------


@dataclass(frozen=True)
class Immutable:
    """``changed(state, patch)``: the param a patch changes the field by
    (None: it leaves it be); refused with ``code``; ``without(patch)``: the
    patch with the field taken out, so the rest of the update still applies."""

    code: str
    changed: Callable[[SessionState, SessionUpdate], str | None]
    without: Callable[[SessionUpdate], SessionUpdate]


def _audio_started(state: SessionState) -> bool:
    """Whether the assistant has spoken in this session: a response made
    audio, or the conversation holds assistant audio."""
    responses = (state.response, state.last_response)
    if any(r is not None and r.playback.generated_ms > 0 for r in responses):
        return True
    return any(
        item.role == "assistant" and any(part.audio_ms > 0 for part in item.parts)
        for item in state.items
    )


def _voice_changed_after_audio(state: SessionState, patch: SessionUpdate) -> str | None:
    """A voice is fixed once the assistant has spoken, or once the session
    has input (a model that declares voice fixed and primes its voice
    prompt, Moshi, has heard it by then)."""
    named: list[tuple[object, str]] = [(patch.voice, "session.voice")]
    if patch.audio is not UNSET and patch.audio.output is not UNSET:
        named.append((patch.audio.output.voice, "session.audio.output.voice"))
    fixed = state.input_started or _audio_started(state)
    for voice, param in named:
        if isinstance(voice, str) and voice != state.config.voice and fixed:
            return param
    return None


def _without_voice(patch: SessionUpdate) -> SessionUpdate:
    audio = patch.audio
    if audio is not UNSET and audio.output is not UNSET:
        output = msgspec.structs.replace(audio.output, voice=UNSET)
        audio = msgspec.structs.replace(audio, output=output)
    return msgspec.structs.replace(patch, voice=UNSET, audio=audio)


def _instructions_changed(state: SessionState, patch: SessionUpdate) -> str | None:
    """Instructions are fixed once the session has input: a model that
    declares them fixed reads them once, before its first unit (Moshi's
    persona prompt); until then an update may still set them."""
    changed = (
        isinstance(patch.instructions, str) and patch.instructions != state.config.instructions
    )
    if changed and state.input_started:
        return "session.instructions"
    return None


def _temperature_changed(state: SessionState, patch: SessionUpdate) -> str | None:
    """The temperature is fixed once the session has input: a model that
    declares it fixed sets its sampling when its stream opens (Moshi, at the
    first input audio, with the seed a resume draws the same noise from)."""
    changed = isinstance(patch.temperature, float) and patch.temperature != state.config.temperature
    if changed and state.input_started:
        return "session.temperature"
    return None


def _model_changed(state: SessionState, patch: SessionUpdate) -> str | None:
    """Names another model than the session's (a name the model answers to
    is taken out of the patch before this is asked: ``model_update``)."""
    if isinstance(patch.model, str) and patch.model != state.config.model:
        return "session.model"
    return None


def _without(field: str) -> Callable[[SessionUpdate], SessionUpdate]:
    return lambda patch: msgspec.structs.replace(patch, **{field: UNSET})


IMMUTABLE_AFTER_OPEN: dict[str, Immutable] = {
    "model": Immutable("model_update_unsupported", _model_changed, _without("model")),
    "voice": Immutable(
        "voice_update_after_audio_unsupported", _voice_changed_after_audio, _without_voice
    ),
    "instructions": Immutable(
        "instructions_update_unsupported", _instructions_changed, _without("instructions")
    ),
    "temperature": Immutable(
        "temperature_update_unsupported", _temperature_changed, _without("temperature")
    ),
}


def model_update(patch: SessionUpdate, names: ModelNames) -> SessionUpdate:
    """A ``session.update`` naming a name the session's model answers to
    (its own, a served name, an OpenAI alias) changes nothing: the field is
    taken out. Another name is left for ``immutable_refusals`` to refuse."""
    if isinstance(patch.model, str) and names.answers_to(patch.model):
        return msgspec.structs.replace(patch, model=UNSET)
    return patch


def immutable_refusals(
    state: SessionState, event: ce.SessionUpdateEvent, capabilities: Capabilities
) -> tuple[SessionUpdate, list[ProtocolError]]:
    """The update without the fields the model fixed at open that it would
    change, and the refusal of each: one refused field never throws away the
    rest of an update (PROTOCOL.md). Sending a field's current value again
    is no change. The model is fixed for every model."""
    patch, refusals = event.session, []
    for name in dict.fromkeys(["model", *capabilities.immutable_after_open]):
        rule = IMMUTABLE_AFTER_OPEN[name]
        if (param := rule.changed(state, patch)) is None:
            continue
        refusals.append(
            ProtocolError(
                rule.code,
                f"this model cannot change {param} of an open session; "
                "the rest of the update was applied",
                param=param,
                event_id=event.event_id,
            )
        )
        patch = rule.without(patch)
    return patch, refusals


def refuse_gated(
    state: SessionState, command: object, capabilities: Capabilities
) -> ProtocolError | None:
    """What ``pipeline.admit`` asks before the handler: the refusal of a
    client event the model cannot serve (None for anything else, and for
    the server's own commands, which are not gated here). A session.update
    is never refused whole here: its fixed fields are (``immutable_refusals``)."""
    if not isinstance(command, ce.ClientEvent):
        return None
    return refuse_unsupported(command, capabilities)
