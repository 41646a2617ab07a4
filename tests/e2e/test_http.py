"""GET /health, /ready, /v1/models, /v1/sessions/{id}, /v1/sessions/{id}/events."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import platform
import re
from pathlib import Path

import httpx
import openai
import pytest

from duplex_bench.redis_process import RedisServer
from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from duplex_server.metrics import histogram_quantile, parse_histogram
from duplex_server.sessions.core.model_names import OPENAI_REALTIME_LISTED
from tests.conftest import running_server
from tests.scrape import grew, scrape, value
from tests.wsclient import tone_pcm16

REPO = Path(__file__).resolve().parents[2]


async def test_health_and_models(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        health = (await http.get("/health")).json()
        models = (await http.get("/v1/models")).json()
    assert health["status"] == "ok" and health["model"] == "echo" and health["sessions"] == 0
    assert models["object"] == "list"
    # the served name first, then OpenAI's realtime names, aliases of it
    ids = [model["id"] for model in models["data"]]
    assert ids == ["echo", *OPENAI_REALTIME_LISTED]
    assert {model["root"] for model in models["data"]} == {"echo"}
    assert [model["parent"] for model in models["data"]] == [None] + ["echo"] * (len(ids) - 1)
    model = models["data"][0]
    assert model["capabilities"]["supports_session_resume"] is True
    for entry in models["data"]:  # what the openai SDK's models.list() parses
        openai.types.Model.model_validate(entry)


async def test_the_version_is_told_and_exported(server):
    installed = importlib.metadata.version("duplex-server")
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        version = (await http.get("/version")).json()
        exported = (await http.get("/metrics")).text
    assert version == {"version": installed, "python": platform.python_version()}
    line = f'duplex_build_info{{python="{platform.python_version()}",version="{installed}"}} 1.0'
    assert line in exported.splitlines()


@pytest.mark.server_config(
    served_model_name=["house-voice", "backup"], no_openai_model_aliases=True
)
async def test_served_model_names_are_the_models_list(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        models = (await http.get("/v1/models")).json()
    assert [model["id"] for model in models["data"]] == ["house-voice", "backup"]


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


async def test_metrics_follow_a_voice_turn(server):
    before = await scrape(server.http_url)
    client, _ = await server.open()
    for _ in range(3):
        await client.send({"type": "session.heartbeat"})
        await client.expect("session.heartbeat_ack")
    await client.append(tone_pcm16(300))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.recv_until("response.done")
    after = await scrape(server.http_url)
    events = "duplex_client_events"
    assert grew(before, after, events, f"{events}_total", type="session.heartbeat") == 3
    assert grew(before, after, events, f"{events}_total", type="input_audio_buffer.commit") == 1
    opened = "duplex_sessions_opened"
    assert grew(before, after, opened, f"{opened}_total", model="echo") == 1
    assert value(after, "duplex_sessions_live", "duplex_sessions_live", model="echo") == 1
    for histogram in (
        "duplex_append_latency_seconds",
        "duplex_store_append_seconds",
        "duplex_commit_to_first_audio_seconds",
    ):
        assert grew(before, after, histogram, f"{histogram}_count") >= 1, histogram
    buckets = parse_histogram(await _text(server), "duplex_commit_to_first_audio_seconds")
    assert 0 < histogram_quantile(buckets, 0.5) < 10.0
    # The standard collectors an operator's dashboards expect.
    assert value(after, "process_resident_memory_bytes", "process_resident_memory_bytes") > 0
    assert "python_gc_collections" in after


async def _text(server) -> str:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        return (await http.get("/metrics")).text


async def test_the_grafana_dashboard_plots_only_series_the_server_exports(server):
    dashboard = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    names = [re.findall(r"\b(?:duplex|process)_\w+", expr) for expr in exprs]
    assert all(names), [expr for expr, found in zip(exprs, names, strict=True) if not found]
    queried = {name for found in names for name in found}
    assert {
        "duplex_llm_ttft_seconds_bucket",
        "duplex_llm_tpot_seconds_bucket",
        "duplex_llm_inter_token_seconds_bucket",
        "duplex_model_tick_seconds_bucket",
        "duplex_batch_jobs_total",
    } <= queried
    families = await scrape(server.http_url)
    exported = {sample for family in families.values() for sample, _ in family} | set(families)
    suffixes = ("_bucket", "_count", "_sum", "_total")
    missing = {
        name
        for name in queried
        if name not in exported and not any(name.removesuffix(s) in families for s in suffixes)
    }
    assert len(queried) >= 15 and not missing, missing


async def test_ready_when_the_replica_can_open_a_session(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        response = await http.get("/ready")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "reasons": []}


@pytest.mark.server_config(max_sessions=1)
async def test_not_ready_while_admission_is_full(server):
    client, _ = await server.open()
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        full = await http.get("/ready")
        alive = await http.get("/health")
        await client.send({"type": "session.close"})
        await client.recv_until("session.closed")
        for _ in range(100):  # the closed session leaves the registry
            if not server.manager.actors:
                break
            await asyncio.sleep(0.02)
        again = await http.get("/ready")
    assert full.status_code == 503
    assert full.json() == {"status": "unready", "reasons": ["admission_full"]}
    assert alive.status_code == 200  # /health stays a liveness check
    assert again.status_code == 200


async def test_not_ready_while_the_model_is_not_loaded(server, monkeypatch):
    monkeypatch.setattr(server.app.state.model, "loaded", False)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        response = await http.get("/ready")
    assert response.status_code == 503
    assert response.json()["reasons"] == ["model_not_loaded"]


async def test_not_ready_while_the_store_is_unreachable(tmp_path):
    """A Redis that stops answering: /ready drains the replica (503), /health
    still says it lives (200, degraded); once Redis is back, ready again."""
    redis = RedisServer(tmp_path / "redis").start()
    config = ServerConfig(port=free_port(), model="echo", store=redis.url)
    try:
        async with (
            running_server(config) as server,
            httpx.AsyncClient(base_url=server.http_url) as http,
        ):
            assert (await http.get("/ready")).status_code == 200
            await asyncio.to_thread(redis.stop)
            down = await http.get("/ready")
            alive = await http.get("/health")
            assert down.status_code == 503
            assert down.json() == {"status": "unready", "reasons": ["store_unreachable"]}
            assert alive.status_code == 200 and alive.json()["status"] == "degraded"
            await asyncio.to_thread(redis.start)
            for _ in range(100):
                if (back := await http.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert back.status_code == 200
    finally:
        redis.stop()
