"""The session fields OpenAI and vLLM-Omni document, sent over a real socket
in each dialect: echoed in ``session.updated``, which the openai SDK's models
(checked under every test's socket, tests/openai_conformance.py) accept."""

from __future__ import annotations

import pytest

from tests.wsclient import WsClient

EVERYTHING = {
    "sample_rate": 16_000,
    "audio": {"output": {"sample_rate_hz": 22_050}},
    "max_tokens": 200,
    "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    "tool_choice": "required",
    "input_audio_noise_reduction": {"type": "near_field"},
    "tracing": "auto",
    "metadata": {"ticket": "T-1"},
    "include": ["item.input_audio_transcription.logprobs"],
    "prompt": {"id": "pmpt_1", "variables": {"name": "Ada"}},
    "response_format": "pcm16",
    "truncation": {"type": "retention_ratio", "retention_ratio": 0.5},
}


@pytest.mark.parametrize("events", ["ga", "beta"])
async def test_every_documented_field_is_echoed_in_each_dialect(server, events):
    client = await WsClient.connect(f"ws://{server.base}/v1/realtime?duplex=1&events={events}")
    await client.expect("session.created")
    await client.send({"type": "session.update", "session": EVERYTHING})
    session = (await client.expect("session.updated"))["session"]
    assert session["duplex"]["input_format"]["rate"] == 16_000
    assert session["duplex"]["output_format"]["rate"] == 22_050
    assert session["max_response_output_tokens"] == 200
    assert session["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
    stored = (
        "input_audio_noise_reduction",
        "tracing",
        "metadata",
        "include",
        "prompt",
        "truncation",
    )
    for field in (*stored, "response_format"):
        assert session[field] == EVERYTHING[field], field
    assert session["tool_choice"] == "required"
    await client.close()
