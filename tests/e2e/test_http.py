"""GET /health, /v1/models, /v1/sessions/{id}, /v1/sessions/{id}/events."""

from __future__ import annotations

import json

import httpx

from tests.wsclient import tone_pcm16


async def test_health_and_models(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        health = (await http.get("/health")).json()
        models = (await http.get("/v1/models")).json()
    assert health["status"] == "ok" and health["model"] == "echo" and health["sessions"] == 0
    assert models["object"] == "list"
    (model,) = models["data"]
    assert model["id"] == "echo" and model["capabilities"]["supports_session_resume"] is True


async def test_session_log_as_json_lines(server):
    client, created = await server.open()
    session_id = created["session"]["id"]
    await client.append(tone_pcm16(100), event_id="evt-a")
    await client.send({"type": "input_audio_buffer.commit"})
    await client.recv_until("rate_limits.updated")
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        response = await http.get(f"/v1/sessions/{session_id}/events")
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.text.splitlines()]
        later = await http.get(f"/v1/sessions/{session_id}/events", params={"after": 3})
        bad = await http.get(f"/v1/sessions/{session_id}/events", params={"after": "x"})
        missing = await http.get("/v1/sessions/sess_missing/events")
        detail = (await http.get(f"/v1/sessions/{session_id}")).json()
    assert [line["seq"] for line in lines] == list(range(1, len(lines) + 1))
    assert [line["kind"] for line in lines[:3]] == ["lease", "config", "audio"]
    assert lines[2]["event_id"] == "evt-a" and lines[2]["body"]["duration_ms"] == 100.0
    kinds = {line["kind"] for line in lines}
    assert {"commit", "decision", "out"} <= kinds
    assert all(line["body"]["kind"] == line["kind"] for line in lines)
    assert [json.loads(x)["seq"] for x in later.text.splitlines()][0] == 4
    assert bad.status_code == 400 and missing.status_code == 404
    assert detail["id"] == session_id and detail["turn_id"] == 1


async def test_metrics_count_applied_events(server):
    from duplex_server.metrics import histogram_quantile, parse_histogram

    client, _ = await server.open()
    for _ in range(3):
        await client.send({"type": "session.heartbeat"})
        await client.expect("session.heartbeat_ack")
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        text = (await http.get("/metrics")).text
    assert "duplex_client_events_total 3" in text
    assert "duplex_sessions_opened_total 1" in text and "duplex_sessions_live 1" in text
    buckets = parse_histogram(text, "duplex_append_latency_seconds")
    assert buckets[-1] == (float("inf"), 3)
    assert 0 < histogram_quantile(buckets, 0.5) < 5.0
