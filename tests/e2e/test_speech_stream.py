"""``WS /v1/audio/speech/stream`` against a real server: text in fragments,
eSpeak NG speech out sentence by sentence, on the socket as the issue and
vLLM-Omni word it."""

from __future__ import annotations

import asyncio
import io
import json
import wave
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import websockets

from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from tests.conftest import RunningServer, running_server

RECV_TIMEOUT_S = 30.0
KEY = "speech-stream-test-key"


@pytest.fixture
async def speech_server() -> AsyncIterator[RunningServer]:
    config = ServerConfig(port=free_port(), model="cascade", asr="pocketsphinx", api_key=KEY)
    async with running_server(config) as running:
        yield running


class SpeechSocket:
    """A raw client: JSON events out; JSON events and audio bytes in."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws

    async def send(self, type_: str, **fields: Any) -> None:
        await self.ws.send(json.dumps({"type": type_, **fields}))

    async def recv(self) -> dict[str, Any] | bytes:
        frame = await asyncio.wait_for(self.ws.recv(), RECV_TIMEOUT_S)
        return frame if isinstance(frame, bytes) else json.loads(frame)

    async def event(self, type_: str) -> dict[str, Any]:
        frame = await self.recv()
        assert isinstance(frame, dict) and frame["type"] == type_, frame
        return frame

    async def sentence(self) -> tuple[dict[str, Any], bytes, dict[str, Any]]:
        """One ``audio.start``, its binary frames, its ``audio.done``."""
        start = await self.event("audio.start")
        audio = b""
        while isinstance(frame := await self.recv(), bytes):
            audio += frame
        assert frame["type"] == "audio.done", frame
        assert (frame["utterance_index"], frame["sentence_index"]) == (
            start["utterance_index"],
            start["sentence_index"],
        )
        assert frame["audio_bytes"] == len(audio)
        return start, audio, frame

    async def error(self) -> dict[str, Any]:
        return (await self.event("error"))["error"]


async def connect(server: RunningServer, key: str = KEY) -> SpeechSocket:
    ws = await websockets.connect(
        f"ws://{server.base}/v1/audio/speech/stream",
        additional_headers={"Authorization": f"Bearer {key}"},
        max_size=None,
    )
    return SpeechSocket(ws)


def loudness(pcm: bytes) -> float:
    return float(np.abs(np.frombuffer(pcm, "<i2").astype(np.float64)).mean())


async def test_sentences_are_spoken_as_they_complete(speech_server):
    socket = await connect(speech_server)
    await socket.send("session.config", response_format="pcm", sample_rate=16_000)
    await socket.send("input.text", text="Hello there. Dr. Smith paid")
    await socket.send("input.text", text=" 3.50 dollars, e.g. coins! And then")
    # The first two sentences are spoken before the utterance ends.
    start, audio, done = await socket.sentence()
    assert start == {
        "type": "audio.start",
        "utterance_index": 0,
        "sentence_index": 0,
        "sentence_text": "Hello there.",
        "format": "pcm",
        "sample_rate": 16_000,
    }
    assert done["duration_ms"] == len(audio) * 1000 // 32_000 > 300
    assert loudness(audio) > 100
    start, _, _ = await socket.sentence()
    assert start["sentence_text"] == "Dr. Smith paid 3.50 dollars, e.g. coins!"
    await socket.send("input.done")
    start, audio, _ = await socket.sentence()
    assert (start["sentence_index"], start["sentence_text"]) == (2, "And then")
    assert await socket.event("utterance.done") == {
        "type": "utterance.done",
        "utterance_index": 0,
        "sentences": 3,
    }
    # The socket stays open for the next utterance.
    await socket.send("input.text", text="Again.")
    await socket.send("input.done")
    start, _, _ = await socket.sentence()
    assert (start["utterance_index"], start["sentence_index"]) == (1, 0)
    assert (await socket.event("utterance.done"))["sentences"] == 1
    await socket.send("session.close")
    assert await socket.event("session.done") == {
        "type": "session.done",
        "utterances": 2,
        "total_sentences": 4,
    }
    with pytest.raises(websockets.ConnectionClosedOK):
        await socket.recv()
    assert socket.ws.close_code == 1000


async def test_config_is_sticky_and_refused_mid_utterance(speech_server):
    socket = await connect(speech_server)
    await socket.send("session.config", response_format="wav", sample_rate=22_050, voice="echo")
    await socket.send("input.text", text="One sentence")
    await socket.send("session.config", response_format="pcm")
    error = await socket.error()
    assert (error["code"], error["param"]) == ("config_update_mid_utterance", "type")
    await socket.send("input.done")
    start, audio, _ = await socket.sentence()  # still the first config: one WAV file
    assert (start["format"], start["sample_rate"]) == ("wav", 22_050)
    with wave.open(io.BytesIO(audio)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (22_050, 1, 2)
        assert wav.getnframes() > 22_050 // 4
    await socket.event("utterance.done")
    # Between utterances a new config is taken, and it holds from then on.
    await socket.send("session.config", response_format="pcm", split_granularity="none")
    for _ in range(2):
        await socket.send("input.text", text="First. Second.")
        await socket.send("input.done")
        start, _, _ = await socket.sentence()
        assert (start["format"], start["sentence_text"]) == ("pcm", "First. Second.")
        assert (await socket.event("utterance.done"))["sentences"] == 1


async def test_clause_granularity_and_cjk_marks(speech_server):
    socket = await connect(speech_server)
    await socket.send("session.config", response_format="pcm", split_granularity="clause")
    await socket.send("input.text", text="Well, it is 1,000 miles; far.")
    await socket.send("input.done")
    texts = [(await socket.sentence())[0]["sentence_text"] for _ in range(3)]
    assert texts == ["Well,", "it is 1,000 miles;", "far."]
    await socket.event("utterance.done")
    await socket.send("session.config", response_format="pcm", voice="cmn")
    await socket.send("input.text", text="你好。谢谢！")
    await socket.send("input.done")
    texts = [(await socket.sentence())[0]["sentence_text"] for _ in range(2)]
    assert texts == ["你好。", "谢谢！"]


@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        ({"type": "session.config", "response_format": "mp3"}, "invalid_value", "response_format"),
        ({"type": "session.config", "voice": "no-such-voice"}, "invalid_value", "voice"),
        ({"type": "session.config", "speed": 9.0}, "invalid_value", "speed"),
        ({"type": "session.config", "sample_rate": 100}, "invalid_value", "sample_rate"),
        ({"type": "session.config", "model": "whisper-1"}, "invalid_value", "model"),
        ({"type": "session.config", "split_granularity": "word"}, "invalid_event", None),
        ({"type": "session.config", "stream_audio": True}, "invalid_event", "stream_audio"),
        ({"type": "input.text"}, "invalid_event", "text"),
        ({"type": "input.text", "text": "x" * 16_385}, "payload_too_large", "text"),
        ({"type": "speak.now"}, "unknown_event_type", "type"),
    ],
)
async def test_bad_input_is_refused_by_name_and_the_socket_serves_on(
    speech_server, frame, code, param
):
    socket = await connect(speech_server)
    await socket.ws.send(json.dumps(frame))
    error = await socket.error()
    assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    await socket.send("input.text", text="Still here.")
    await socket.send("input.done")
    start, _, _ = await socket.sentence()
    assert start["sentence_text"] == "Still here."


async def test_audio_in_and_floods_are_refused(speech_server):
    socket = await connect(speech_server)
    await socket.ws.send(b"\x00\x01")
    assert (await socket.error())["code"] == "invalid_event"
    for _ in range(200):
        await socket.send("input.text", text="")
    codes = set()
    while "rate_limited" not in codes:
        codes.add((await socket.error())["code"])
    await asyncio.sleep(2.0)  # the bucket refills (FRAMES_PER_S, two seconds' burst)
    await socket.send("input.text", text="Calm again.")
    await socket.send("input.done")
    while isinstance(frame := await socket.recv(), dict) and frame["type"] == "error":
        assert frame["error"]["code"] == "rate_limited"  # refusals still queued for the flood
    assert isinstance(frame, dict) and frame["type"] == "audio.start", frame
    assert frame["sentence_text"] == "Calm again."


async def test_the_route_needs_a_key_with_the_batch_scope(speech_server):
    with pytest.raises(websockets.InvalidStatus) as refused:
        await connect(speech_server, key="wrong")
    assert refused.value.response.status_code == 401


async def test_a_server_without_a_synthesiser_refuses_the_upgrade():
    config = ServerConfig(port=free_port(), model="echo")
    async with running_server(config) as plain:
        with pytest.raises(websockets.InvalidStatus) as refused:
            await connect(plain)
    assert refused.value.response.status_code == 404
    assert json.loads(refused.value.response.body)["error"]["code"] == "model_not_loaded"
