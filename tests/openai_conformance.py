"""Every server event a test receives is checked against the openai SDK's models.

PROTOCOL.md's rule: an event whose ``type`` OpenAI defines validates against
the SDK's model of that type (GA models on GA connections, beta models on
beta connections); our extension events validate against our own structs.
Stock clients (Pipecat's OpenAI Realtime service among them) parse with those
models and go mute on the first event that fails, so a regression here must
fail a test, whichever test happened to receive the event.

The check sits under the websockets client itself (``install()`` wraps
``ClientConnection.process_event``), so raw test clients, ``DuplexClient``,
the ``openai`` SDK and Pipecat are all covered without their cooperation.
Violations are collected, not raised inside the socket's reader;
``tests/conftest.py`` fails the test that saw one.

On the plain OpenAI endpoint (``/v1/realtime`` without ``?duplex=1``) an
event type OpenAI does not define fails too, unless the session opted in to
the extensions (``?duplex_events=1``, or a ``session.update`` the client sent
with ``"duplex_events": true``) or the event answers an extension the client
itself sent (a heartbeat's ack, its resume, its playback ack).

One documented exception: the beta ``session.model`` is a closed list of
OpenAI model names; a self-hosted model name cannot be one of them, so the
check puts an OpenAI name in its place before validating.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import pydantic
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent as GAServerEvent
from websockets.asyncio.client import ClientConnection
from websockets.frames import Frame, Opcode

from protocol.server_events import SERVER_EVENT_TYPES

# A beta session.model the SDK accepts, standing in for a self-hosted name.
BETA_MODEL_STAND_IN = "gpt-4o-realtime-preview"
ENDPOINTS = ("/v1/realtime", "/v1/duplex")


def _models_by_type(union: Any) -> dict[str, type[pydantic.BaseModel]]:
    """The SDK's model class of each event type in a server-event union (one
    class a type, so a failure names the fields, not 40 union members)."""
    members = typing.get_args(union)
    if typing.get_origin(union) is typing.Annotated:
        members = typing.get_args(members[0])
    return {
        event_type: member
        for member in members
        for event_type in typing.get_args(member.model_fields["type"].annotation)
    }


GA_MODELS = _models_by_type(GAServerEvent)
BETA_MODELS = _models_by_type(BetaServerEvent)


@dataclass(frozen=True)
class Violation:
    dialect: str
    event_type: str
    detail: str
    event: str

    def __str__(self) -> str:
        return f"[{self.dialect}] {self.event_type}: {self.detail}\n    event: {self.event[:600]}"


violations: list[Violation] = []
checked: dict[str, int] = {}


def dialect_of(path: str, headers: Any) -> str:
    """The event dialect the server owes this connection (PROTOCOL.md)."""
    events = parse_qs(urlsplit(path).query).get("events", [""])[-1]
    if events in ("beta", "both", "ga"):
        return events
    beta_header = headers.get("OpenAI-Beta", "") if headers is not None else ""
    return "beta" if "realtime=v1" in beta_header else "ga"


# Extension events a plain socket gets only when the client used the extension.
ASKED_EXTENSIONS = frozenset(
    {
        "session.heartbeat_ack",
        "session.closed",
        "session.resumed",
        "session.replaced",
        "session.resync_required",
        "playback.acknowledged",
    }
)
_TRUE = ("1", "true", "on", "yes")


def takes_extensions(path: str) -> bool:
    """Whether a socket opened at ``path`` is sent the duplex extension events:
    the duplex wire, or the OpenAI endpoint with ``?duplex_events=1``."""
    split = urlsplit(path)
    query = parse_qs(split.query)
    flagged = any(
        query.get(name, [""])[-1].lower() in _TRUE for name in ("duplex", "duplex_events")
    )
    return split.path.rstrip("/").endswith("/v1/duplex") or flagged


def check_event(raw: str, dialect: str, extensions: bool = True) -> Violation | None:
    """None when ``raw`` is what a client of ``dialect`` may receive;
    ``extensions``: whether the socket takes the duplex extension events."""
    try:
        event = json.loads(raw)
    except ValueError as exc:
        return Violation(dialect, "?", f"not JSON: {exc}", raw)
    event_type = event.get("type") if isinstance(event, dict) else None
    if not isinstance(event_type, str):
        return Violation(dialect, "?", "no string 'type'", raw)
    checked[event_type] = checked.get(event_type, 0) + 1
    generation = _generation_for(event_type, dialect)
    if generation == "other":
        return Violation(dialect, event_type, "an event name of the other generation", raw)
    if generation is None:
        if not extensions and event_type not in ASKED_EXTENSIONS:
            return Violation(dialect, event_type, "an extension on the OpenAI endpoint", raw)
        return _check_extension(event_type, raw, dialect)
    try:
        if generation == "beta":
            BETA_MODELS[event_type].model_validate(_with_beta_model(event))
        else:
            GA_MODELS[event_type].model_validate(event)
    except pydantic.ValidationError as exc:
        return Violation(dialect, event_type, str(exc), raw)
    return None


def _generation_for(event_type: str, dialect: str) -> str | None:
    """Which SDK models judge ``event_type`` on a ``dialect`` connection:
    "ga", "beta", "other" (a name this connection must never get) or None
    (our own extension event)."""
    in_ga, in_beta = event_type in GA_MODELS, event_type in BETA_MODELS
    if dialect == "beta":
        return "beta" if in_beta else ("other" if in_ga else None)
    if dialect == "ga":
        return "ga" if in_ga else ("other" if in_beta else None)
    # both: each spelling against its own generation, shared names as GA
    return "ga" if in_ga else ("beta" if in_beta else None)


def _with_beta_model(event: dict[str, Any]) -> dict[str, Any]:
    session = event.get("session")
    if isinstance(session, dict) and "model" in session:
        event = {**event, "session": {**session, "model": BETA_MODEL_STAND_IN}}
    return event


def _check_extension(event_type: str, raw: str, dialect: str) -> Violation | None:
    cls = SERVER_EVENT_TYPES.get(event_type)
    if cls is None:
        return Violation(dialect, event_type, "neither OpenAI's nor ours", raw)
    try:
        msgspec.json.decode(raw, type=cls)
    except msgspec.ValidationError as exc:
        return Violation(dialect, event_type, f"our own struct: {exc}", raw)
    return None


def _observe(connection: ClientConnection, frame: Frame) -> None:
    request = connection.request
    if request is None or not request.path.startswith(ENDPOINTS):
        return
    if frame.opcode is not Opcode.TEXT or not frame.fin:
        return
    extensions = takes_extensions(request.path) or getattr(connection, _OPTED_IN, False)
    dialect = dialect_of(request.path, request.headers)
    violation = check_event(bytes(frame.data).decode(), dialect, extensions)
    if violation is not None:
        violations.append(violation)


_installed = False
_OPTED_IN = "_duplex_events_opted_in"


def _note_opt_in(connection: ClientConnection, message: Any) -> None:
    """A ``session.update`` the client sent that turns the extensions on."""
    text = message if isinstance(message, str) else None
    if text is not None and '"duplex_events"' in text:
        extra = (json.loads(text).get("session") or {}).get("extra_body") or {}
        if "duplex_events" in extra:
            setattr(connection, _OPTED_IN, bool(extra["duplex_events"]))


def install() -> None:
    """Wrap the websockets client so every received text frame is checked."""
    global _installed
    if _installed:
        return
    original = ClientConnection.process_event
    original_send = ClientConnection.send

    def process_event(self: ClientConnection, event: Any) -> None:
        original(self, event)
        if isinstance(event, Frame):
            _observe(self, event)

    async def send(self: ClientConnection, message: Any, text: bool | None = None) -> None:
        _note_opt_in(self, message)
        await original_send(self, message, text=text)

    ClientConnection.process_event = process_event  # type: ignore[method-assign]
    ClientConnection.send = send  # type: ignore[method-assign]
    _installed = True
