"""Session traces end to end: a spoken turn on the cascade, exported over
OTLP/HTTP to a real receiver in this process (tests/otlp_receiver.py), and
nothing sent when tracing is off."""

from __future__ import annotations

import pytest

from duplex_server.config import ServerConfig
from tests import otlp_receiver as otlp
from tests.conftest import free_port, running_server
from tests.e2e.test_voice import LEAD_MS, RATE, stream_paced
from tests.speech import PHRASES, silence, speak

TRACING = {"workflow_name": "support-call", "group_id": "group-7", "metadata": {"tier": "gold"}}


def voice_config(tmp_path, **settings) -> ServerConfig:
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("\n".join(PHRASES))
    return ServerConfig(
        port=free_port(), store="memory", model="cascade", asr_phrases=str(phrases), **settings
    )


async def spoken_session(server) -> str:
    """One spoken turn under server VAD, answered; the session's id."""
    client, created = await server.open()
    detection = {"type": "server_vad", "silence_duration_ms": 500}
    await client.send(
        {"type": "session.update", "session": {"turn_detection": detection, "tracing": TRACING}}
    )
    await client.expect("session.updated")
    await stream_paced(client, silence(LEAD_MS) + speak(PHRASES[0], RATE) + silence(1200))
    done = (await client.recv_until("response.done", timeout=20))[-1]
    assert done["response"]["status"] == "completed"
    await client.close()
    return created["session"]["id"]


@pytest.fixture
def no_otel_environment(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)


async def test_a_spoken_turn_is_one_trace_of_spans(tmp_path, no_otel_environment):
    with otlp.OtlpReceiver() as receiver:
        config = voice_config(tmp_path, otlp_traces_endpoint=receiver.url)
        async with running_server(config) as server:
            session_id = await spoken_session(server)
        # The server's shutdown ended the session and flushed the exporter.
        spans = list(receiver.spans)
    assert receiver.posts and set(receiver.posts) == {"/v1/traces"}
    (root,) = [s for s in spans if s.name == "session"]
    assert root.parent_id == "" and root.attributes["duplex.session.id"] == session_id
    assert root.resource["service.name"] == "duplex-server"
    assert root.attributes["duplex.model"] == "cascade"
    assert root.attributes["openai.tracing.workflow_name"] == "support-call"
    assert root.attributes["openai.tracing.group_id"] == "group-7"
    assert root.attributes["openai.tracing.metadata.tier"] == "gold"
    assert {s.trace_id for s in spans} == {root.trace_id}  # one session, one trace
    by_id = {s.span_id: s for s in spans}
    assert all(s.parent_id in by_id for s in spans if s is not root)

    def named(name: str):
        found = [s for s in spans if s.name == name]
        assert len(found) == 1, (name, [s.name for s in spans])
        return found[0]

    turn = named("turn")
    assert turn.parent_id == root.span_id
    # Set before the user spoke: the turn's spans carry the workflow too.
    assert turn.attributes["openai.tracing.workflow_name"] == "support-call"
    for child in ("vad.speech", "asr", "turn.commit", "response"):
        assert named(child).parent_id == turn.span_id, child
    response = named("response")
    assert response.attributes["duplex.response.status"] == "completed"
    assert response.attributes["openai.tracing.group_id"] == "group-7"
    first_audio = named("tts.first_audio")
    assert first_audio.parent_id == response.span_id
    assert first_audio.start_ns == response.start_ns < first_audio.end_ns <= response.end_ns
    assert first_audio.attributes["duplex.stage.tts_first_clause_ms"] > 0
    speech, asr, commit = named("vad.speech"), named("asr"), named("turn.commit")
    # VAD heard the end, then recognition ran, then the commit was recorded.
    assert turn.start_ns == speech.start_ns < speech.end_ns <= asr.start_ns
    assert asr.start_ns < asr.end_ns == commit.start_ns <= response.start_ns
    assert commit.attributes["duplex.is_speech"] is True
    assert commit.attributes["duplex.stage.asr_final_ms"] > 0
    assert response.end_ns <= turn.end_ns <= root.end_ns
    assert "first_text" in response.events
    # The parrot answered: no LLM spans are made up for it.
    assert not [s for s in spans if s.name.startswith("llm.")]


async def test_off_no_exporter_is_made_and_nothing_is_sent(tmp_path, monkeypatch):
    """No endpoint given: even with the SDK's generic endpoint variable
    pointing at a receiver, nothing is traced, and actors get no tracer."""
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    with otlp.OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.removesuffix("/v1/traces"))
        async with running_server(voice_config(tmp_path)) as server:
            assert server.manager.settings.tracing is None
            client, _ = await server.open()
            (actor,) = server.manager.actors.values()
            assert actor.writer.tracer is None
            await client.close()
            await spoken_session(server)
    assert receiver.posts == [] and receiver.spans == []
