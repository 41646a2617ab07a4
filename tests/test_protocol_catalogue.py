"""Every event type named in PROTOCOL.md exists in ``protocol`` and round-trips."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from protocol.client_events import CLIENT_EVENT_TYPES
from protocol.codec import FrameDecoder, decode_server_event, encode_server_event
from protocol.server_events import BETA_TWIN, SERVER_EVENT_TYPES

ROOT = Path(__file__).resolve().parent.parent
# The repository keeps a copy; a checkout beside ../shared is checked against the original too.
PROTOCOL_FILES = [
    p for p in (ROOT / "docs" / "PROTOCOL.md", ROOT.parent / "shared" / "PROTOCOL.md") if p.exists()
]

# Backticked dotted names in PROTOCOL.md that are fields, not event types.
NOT_EVENTS = {
    "audio.input.format",
    "audio.output.format",
    "audio.input.sample_rate_hz",
    "audio.output.sample_rate_hz",
    "response.metadata",
    "response.duplex",
    "response.voice",
    "session.audio.output.voice",
    "session.model",
    "session.voice",
    "status_details.error",
    "vllm_omni.stage_metrics",
    "capabilities.supports_barge_in",
    "error.error.event_id",
    "metadata.overlap_ms",
    "status_details.reason",
    "extra_body.duplex_events",
    "extra_body.auto_response",
    "audio.output.voice",
    "turn_detection.idle_timeout_ms",
    "audio.input",  # a transcription session's fields (PROTOCOL.md, "Transcription sessions")
    # Server-Sent Events of the batch route POST /v1/audio/transcriptions (stream=true),
    # not WebSocket events
    "transcript.text.delta",
    "transcript.text.done",
    # the batch image routes' Server-Sent Events (stream=true) and the openai SDK
    # calls PROTOCOL.md's batch section names, not WebSocket events
    "image_generation.completed",
    "image_edit.completed",
    "images.generate",
    "images.edit",
    "audio.speech.create",
    "audio.transcriptions.create",
    "videos.create",
    "openai.types",
}
_TOKEN = re.compile(r"`([^`]*)`")
_NAME = re.compile(r"^(\.?[a-z_]+(?:\.[a-z_]+)*(?:/\.?[a-z_]+)*)")


def _expand(token: str, previous: str | None) -> list[str]:
    """``a.b.c/d`` -> a.b.c, a.b.d; ``.x`` after ``a.b.c`` -> a.b.x."""
    head, *alternatives = token.split("/")
    if head.startswith("."):
        if previous is None:
            return []
        head = previous.rsplit(".", 1)[0] + head
    names = [head]
    base = head.rsplit(".", 1)[0]
    names += [base + "." + alt.lstrip(".") for alt in alternatives]
    return names


def catalogue(text: str) -> set[str]:
    names: set[str] = set()
    # Backticked spans may wrap, so tokens are read per paragraph, not per line.
    for line in (" ".join(par.splitlines()) for par in text.split("\n\n")):
        previous = None
        for raw in _TOKEN.findall(line):
            match = _NAME.match(raw.strip())
            if match is None or raw.startswith("*"):
                continue
            token = match.group(1)
            if ".py" in raw:
                continue  # a test or module named as evidence, not an event
            if "." not in token and token not in ("barge_in", "error"):
                continue
            for name in _expand(token, previous):
                if name not in NOT_EVENTS:
                    names.add(name)
                    previous = name
    return names


def documented() -> set[str]:
    names: set[str] = set()
    for path in PROTOCOL_FILES:
        names |= catalogue(path.read_text())
    return names


def test_catalogue_is_found():
    names = documented()
    assert PROTOCOL_FILES, "PROTOCOL.md not found"
    assert {
        "conversation.item.retrieve",
        "input_audio_buffer.speech_stopped",
        "response.function_call_arguments.done",
        "turn.signal",
        "session.updated",
        "response.audio.done",
    } <= names
    assert len(names) >= 58


def test_every_documented_event_is_implemented():
    missing = documented() - set(CLIENT_EVENT_TYPES) - set(SERVER_EVENT_TYPES)
    assert not missing, f"documented but not implemented: {sorted(missing)}"


def test_every_ga_event_has_its_beta_twin():
    for ga, beta in BETA_TWIN.items():
        assert issubclass(beta, ga)
        assert beta.__struct_config__.tag in SERVER_EVENT_TYPES


@pytest.mark.parametrize("event_type", sorted(SERVER_EVENT_TYPES))
def test_server_event_round_trips(event_type):
    event = SERVER_EVENT_TYPES[event_type](event_id="e1", server_event_seq=7)
    wire = encode_server_event(event)
    assert msgspec.json.decode(wire)["type"] == event_type
    assert decode_server_event(wire) == event


# The fields a client event cannot go without, a sample value each.
REQUIRED_FIELDS = {"input.dtmf": {"digit": "5"}}


@pytest.mark.parametrize("event_type", sorted(CLIENT_EVENT_TYPES))
def test_client_event_round_trips(event_type):
    cls = CLIENT_EVENT_TYPES[event_type]
    event = cls(event_id="c1", **REQUIRED_FIELDS.get(event_type, {}))
    wire = msgspec.json.encode(event)
    assert msgspec.json.decode(wire)["type"] == event_type
    assert FrameDecoder().decode(wire) == event
