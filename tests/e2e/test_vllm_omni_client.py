"""vLLM-Omni 0.30.0's DuplexClient, unmodified, holds a turn with a real server
process (echo), with each of its model presets; and ours does the same with
the presets that mirror them.

The echo model answers with what it heard, so the answer, read at the output
rate the preset declares, must last as long as the question: a server that
ignores a declared rate or format (reading float32 as pcm16, 16 kHz as 24 kHz,
or answering at 24 kHz when 22.05 kHz was asked for) answers too long or too
short.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import msgspec
import numpy as np
import pytest

from clients.duplex import AudioFormat, DuplexClient, DuplexTrace, presets
from tests import vllm_omni
from tests.e2e.serverproc import ServerProcess

PRESETS = ["minicpmo_4_5", "personaplex", "nemotron_voicechat"]
QUESTION_MS = 1000
CHUNK_MS = 100
TURN_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def clients(tmp_path_factory) -> Iterator[vllm_omni.VllmOmniClients]:
    """Unavailable (no network for the first download, a dependency missing)
    is a failure, never a skip: the compatibility claim rests on this test."""
    with contextlib.ExitStack() as stack:
        try:
            modules = stack.enter_context(vllm_omni.clients(tmp_path_factory.mktemp("vllm-omni")))
        except vllm_omni.VllmOmniUnavailable as exc:
            reason = str(exc)
        else:
            reason = None
        if reason is not None:
            pytest.fail(reason, pytrace=False)
        yield modules


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ServerProcess("memory").start()
    try:
        yield server.ws_at("/v1/realtime?duplex=1")  # the spelling vLLM-Omni's users write
    finally:
        server.stop()


def tone(fmt: AudioFormat, ms: int = QUESTION_MS) -> bytes:
    t = np.arange(fmt.sample_rate_hz * ms // 1000) / fmt.sample_rate_hz
    wave = 0.25 * np.sin(2 * np.pi * 440 * t)
    if fmt.encoding == "pcm_f32le":
        return wave.astype("<f4").tobytes()
    assert fmt.encoding == "pcm16", fmt
    return (wave * 32767).astype("<i2").tobytes()


def assert_lasts_as_long_as_the_question(answer_ms: float) -> None:
    assert abs(answer_ms - QUESTION_MS) <= CHUNK_MS, f"{answer_ms:.1f} ms answered"


@pytest.mark.parametrize("preset", PRESETS)
def test_our_presets_send_the_session_vllm_omnis_do(clients, preset):
    theirs = clients.preset(preset).create_duplex_session_config()
    ours = msgspec.structs.replace(getattr(presets, preset)(), model="echo")
    assert msgspec.to_builtins(ours) == theirs.to_session_payload(model="echo")


@pytest.mark.parametrize("preset", PRESETS)
async def test_vllm_omni_client_holds_a_turn(clients, url, preset):
    config = clients.preset(preset).create_duplex_session_config()
    question = tone(AudioFormat(config.input_audio.encoding, config.input_audio.sample_rate_hz))

    async def turn():
        async with clients.duplex.DuplexClient(url, model="echo", config=config) as client:
            await client.stream_pcm(question, chunk_ms=CHUNK_MS, realtime=False)
            await client.commit()
            async for response in client.responses():
                if response.decision == "listen" and response.finished:
                    continue  # a listen decision carries no audio
                answer = b"".join([chunk async for chunk in response.audio()])
                return response, answer
        raise AssertionError("the session ended without a response")

    response, answer = await asyncio.wait_for(turn(), TURN_TIMEOUT_S)
    assert response.done_event is not None and response.done_event.type == "response.done"
    assert response.decision == "speak"
    assert_lasts_as_long_as_the_question(config.output_audio.duration_ms(len(answer)))


@pytest.mark.parametrize("preset", PRESETS)
async def test_duplex_client_holds_a_turn(url, preset):
    config = getattr(presets, preset)()
    expected_in = getattr(presets, f"{preset.upper()}_INPUT")
    expected_out = getattr(presets, f"{preset.upper()}_OUTPUT")
    trace = DuplexTrace()
    # binary_audio=False: the JSON appends are what this test reads off the trace
    async with DuplexClient(
        url, model="echo", config=config, trace=trace, binary_audio=False
    ) as client:
        assert (client.input_format, client.output_format) == (expected_in, expected_out)
        await client.stream_pcm(tone(expected_in), chunk_ms=CHUNK_MS, realtime=False)
        await client.commit()
        response = await anext(client.responses(timeout_s=TURN_TIMEOUT_S))
        answer = b"".join([chunk async for chunk in response.audio(TURN_TIMEOUT_S)])
        await response.wait(TURN_TIMEOUT_S)
    assert (response.decision, response.status) == ("speak", "completed")
    assert response.output_format == expected_out
    assert_lasts_as_long_as_the_question(expected_out.duration_ms(len(answer)))
    sent = [json.loads(frame) for _, direction, frame in trace.frames if direction == "out"]
    appends = [event for event in sent if event["type"] == "input_audio_buffer.append"]
    assert [
        (e["format"], e["sample_rate_hz"], e["duration_ms"], e["audio_end_ms"]) for e in appends
    ] == [
        (expected_in.encoding, expected_in.sample_rate_hz, CHUNK_MS, end)
        for end in range(CHUNK_MS, QUESTION_MS + 1, CHUNK_MS)
    ]


def test_a_wheel_with_another_hash_is_refused(tmp_path):
    (tmp_path / vllm_omni.WHEEL_NAME).write_bytes(b"not the pinned wheel")
    with pytest.raises(vllm_omni.VllmOmniUnavailable, match="refusing it"):
        vllm_omni.wheel(cache=tmp_path)
