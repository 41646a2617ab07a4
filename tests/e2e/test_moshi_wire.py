"""``--model moshi:PATH`` on the duplex wire, through a real server process
and a real WebSocket, with a Moshi-architecture checkpoint whose behaviour
is known (``duplex_bench.tiny_moshi.talking_moshi``: it pads while the user talks,
answers ``WORDS`` once they fall silent). A spoken conversation: audio in,
no commit; the model's answer opens by itself, streams audio paired with its
words, and ends when it falls silent (``response.listen``, ``turn.event``);
speech over the answer makes the model yield. Its persona and voice prompt
are primed at the first audio and fixed from then on. Bad input (a wrong
rate or format, a voice that does not exist, changed instructions, client
turn commands it does not take) is refused with a code and the session
serves on; what is not a checkpoint, or voice prompts that cannot be read,
stop the server at start-up. Every event is also checked against the openai
SDK's models (tests/openai_conformance.py, under every test)."""

from __future__ import annotations

import base64
import itertools
import json
import time
import urllib.error
import urllib.request
import wave

import numpy as np
import pytest

from duplex_bench.tiny_moshi import ANSWER, WORDS, speech_pcm16, talking_moshi
from tests.e2e.sequences import AUDIO_CHUNK, RESPONSE_CLOSE, RESPONSE_OPEN
from tests.e2e.serverproc import ServerProcess, run_cli
from tests.wsclient import WsClient, types_of

UNIT_BYTES = 2 * 1920  # one 80 ms unit of pcm16 at 24 kHz
LOAD_TIMEOUT_S = 180.0
ANSWER_TIMEOUT_S = 60.0
QUIET_FRAMES = 10  # floor.QUIET_FRAMES: frames without a word that end the answer


def write_wav(path, samples: np.ndarray) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(24_000)
        out.writeframes((samples * 32767).astype("<i2").tobytes())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return talking_moshi(tmp_path_factory.mktemp("talking") / "moshi")


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
    directory = tmp_path_factory.mktemp("voices")
    tone = np.sin(2 * np.pi * 180 * np.arange(24_000) / 24_000) * 0.3
    write_wav(directory / "pirate.wav", tone)
    return directory


def wait_ready(server: ServerProcess) -> None:
    """Until ``/ready`` answers 200: the weights load after ``/health``."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(server.http_url + "/ready", timeout=2):
                return
        except (urllib.error.HTTPError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="module")
def served(checkpoint, voices):
    server = ServerProcess(
        "memory", model=f"moshi:{checkpoint}", voices=str(voices), moshi_rows=2, dtype="float32"
    )
    server.start(timeout_s=LOAD_TIMEOUT_S)
    try:
        wait_ready(server)
        yield server
    finally:
        server.stop()


async def speak(client: WsClient, pcm: bytes) -> None:
    for at in range(0, len(pcm), UNIT_BYTES):
        await client.append(pcm[at : at + UNIT_BYTES])


async def alive(client: WsClient) -> None:
    """The session serves on: a heartbeat is answered."""
    await client.send({"type": "session.heartbeat"})
    await client.recv_until("session.heartbeat_ack")


_REFUSALS = itertools.count()


async def refused(client: WsClient, event: dict, code: str, param: str | None = None) -> dict:
    """A refusal naming the event; each its own event_id (a session.update
    whose fixed field is refused applies the rest, so its id is taken)."""
    event_id = f"bad-{next(_REFUSALS)}"
    await client.send({**event, "event_id": event_id})
    error = (await client.recv_until("error"))[-1]["error"]
    assert (error["code"], error["event_id"]) == (code, event_id), error
    if param is not None:
        assert error["param"] == param, error
    await alive(client)
    return error


async def test_a_spoken_conversation_on_the_wire(served, checkpoint):
    client = await WsClient.connect(served.ws_url)
    created = await client.expect("session.created")
    caps = created["session"]["capabilities"]
    assert caps["implementation_level"] == "model_native_duplex"
    assert caps["chunk_period_ms"] == 80
    assert caps["supports_client_commit"] is False
    # barge-in is the model's own yield, not a client command
    assert caps["supports_barge_in"] is False and caps["signal_sources"] == ["model_native"]
    assert caps["supports_model_native_turn_policy"] is True
    assert set(caps["immutable_after_open"]) == {"model", "voice", "instructions", "temperature"}
    with urllib.request.urlopen(served.http_url + "/v1/models", timeout=10) as reply:
        listed = json.load(reply)["data"]
    served = [(m["id"], m["capabilities"]) for m in listed if m["parent"] is None]
    assert served == [("moshi", caps)]
    assert {m["parent"] for m in listed[1:]} == {"moshi"}  # OpenAI's names, aliases
    # greedy: the hand-set model says its words only as its argmax
    persona = {"instructions": "be a kind pirate", "voice": "pirate", "temperature": 0}
    await client.send({"type": "session.update", "session": persona})
    updated = (await client.recv_until("session.updated"))[-1]["session"]
    assert (updated["instructions"], updated["voice"]) == ("be a kind pirate", "pirate")
    assert updated["temperature"] == 0

    # The user speaks, then falls silent (the server clocks the silence): no commit.
    await speak(client, speech_pcm16(checkpoint, 6))
    events = await client.recv_until("response.done", timeout=ANSWER_TIMEOUT_S)
    assert "input_audio_buffer.committed" not in types_of(events)
    answer = events[types_of(events).index("response.created") :]
    chunks = len(WORDS) + QUIET_FRAMES - 1  # its words, then its quiet until the turn ends
    expected = RESPONSE_OPEN + AUDIO_CHUNK * chunks + RESPONSE_CLOSE[:-1]
    assert [t for t in types_of(answer) if t != "turn.event"] == expected
    assert [e["event"] for e in answer if e["type"] == "turn.event"] == ["assistant_playing"]
    transcript = [
        e["delta"] for e in answer if e["type"] == "response.output_audio_transcript.delta"
    ]
    assert transcript == [" " + word for word in WORDS] + [""] * (QUIET_FRAMES - 1)
    audio = [e for e in answer if e["type"] == "response.output_audio.delta"]
    assert all(len(base64.b64decode(e["delta"])) == UNIT_BYTES for e in audio)
    done = next(e for e in answer if e["type"] == "response.output_audio_transcript.done")
    assert done["transcript"] == ANSWER
    response = events[-1]["response"]
    assert response["status"] == "completed"
    # ... it fell silent: the floor goes back to the user
    after = await client.recv_until("response.listen")
    assert after[-1]["reason"] == "model_end_of_turn"
    await client.send(
        {"type": "playback.ack", "played_ms": chunks * 80, "response_id": response["id"]}
    )
    acked = await client.recv_until("turn.event")
    assert acked[-1]["event"] == "idle"

    # The user talks again, and over the next answer: the model yields to them.
    await speak(client, speech_pcm16(checkpoint, 4))
    opened = await client.recv_until("response.speak", timeout=ANSWER_TIMEOUT_S)
    second = opened[-1]["response_id"]
    await speak(client, speech_pcm16(checkpoint, 6))
    events = await client.recv_until("response.done", timeout=ANSWER_TIMEOUT_S)
    response = events[-1]["response"]
    assert response["id"] == second and response["status"] == "cancelled"
    assert response["status_details"]["reason"] == "turn_detected"
    assert response["duplex"]["reason"] == "model_yield"
    after = await client.recv_until("turn.event")
    listened = next(e for e in after if e["type"] == "response.listen")
    assert listened["reason"] == "model_yield"

    # Its persona, voice and sampling were set with the first audio: fixed
    # now (the value it has is no change).
    await refused(
        client,
        {"type": "session.update", "session": {"temperature": 0.8}},
        "temperature_update_unsupported",
        "session.temperature",
    )
    await client.send({"type": "session.update", "session": {"temperature": 0}})
    await client.recv_until("session.updated")
    await refused(
        client,
        {"type": "session.update", "session": {"instructions": "be a grumpy pirate"}},
        "instructions_update_unsupported",
        "session.instructions",
    )
    await refused(
        client,
        {"type": "session.update", "session": {"voice": "default"}},
        "voice_update_after_audio_unsupported",
        "session.voice",
    )
    await client.close()


async def test_bad_input_is_refused_and_the_session_serves_on(served, checkpoint):
    client = await WsClient.connect(served.ws_url)
    await client.expect("session.created")
    await refused(
        client,
        {"type": "session.update", "session": {"voice": "nobody"}},
        "invalid_value",
        "session.voice",
    )
    await refused(
        client,
        {"type": "session.update", "session": {"instructions": "arr " * 2000}},
        "invalid_value",
        "session.instructions",
    )
    # a rate no resampler serves, and a format the server does not take
    pcm = speech_pcm16(checkpoint, 1)
    b64 = base64.b64encode(pcm).decode()
    await refused(
        client,
        {"type": "input_audio_buffer.append", "audio": b64, "sample_rate_hz": 3},
        "invalid_audio",
    )
    await refused(
        client,
        {"type": "input_audio_buffer.append", "audio": b64, "format": "mp3"},
        "invalid_audio",
    )
    await refused(
        client,
        {"type": "session.update", "session": {"input_audio_format": "flac"}},
        "invalid_audio",
    )
    rate = {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 3}}}}
    await refused(client, {"type": "session.update", "session": rate}, "invalid_audio")
    # an odd byte count is not pcm16
    await refused(
        client,
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\0" * 3).decode()},
        "invalid_audio",
    )
    # turn commands a model that keeps its own floor does not take
    await refused(client, {"type": "input_audio_buffer.commit"}, "capability_unsupported")
    await refused(client, {"type": "barge_in"}, "capability_unsupported")
    # nothing is ever committed: a request for an answer has no input to answer
    await refused(client, {"type": "response.create"}, "response_create_without_input")
    # audio at another rate it resamples, and still converses
    sixteen = np.frombuffer(speech_pcm16(checkpoint, 6), "<i2")[::3].tobytes()
    for at in range(0, len(sixteen), 2 * 1280):
        await client.append(sixteen[at : at + 2 * 1280], sample_rate_hz=16_000)
    events = await client.recv_until("response.done", timeout=ANSWER_TIMEOUT_S)
    assert events[-1]["response"]["status"] == "completed"
    await client.close()


async def test_a_voice_that_does_not_exist_is_refused_at_open(served):
    """autostart=0: the opening session.update names the voice; refused,
    and the socket stays open for a corrected one."""
    client = await WsClient.connect(served.ws_at("/v1/realtime?duplex=1&events=both&autostart=0"))
    await client.send({"type": "session.update", "session": {"voice": "nobody"}})
    error = (await client.recv_until("error"))[-1]["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "session.voice")
    await client.send({"type": "session.update", "session": {"voice": "pirate"}})
    created = await client.expect("session.created")
    assert created["session"]["voice"] == "pirate"
    await client.close()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d, v: ([f"moshi:{d / 'nowhere'}"], []), "no such directory"),
        (lambda d, v: ([f"moshi:{v}"], []), "not a checkpoint directory"),
        (lambda d, v: ([f"moshi:{d}"], ["--voices", str(v / "nowhere")]), "no such directory"),
        (lambda d, v: ([f"moshi:{d}"], ["--voices", str(v)]), "broken.wav: not an audio file"),
    ],
    ids=["no-directory", "not-a-checkpoint", "no-voices-directory", "voice-not-audio"],
)
def test_what_cannot_be_served_stops_the_server_at_start_up(checkpoint, tmp_path, setup, message):
    voices = tmp_path / "voices"
    voices.mkdir()
    (voices / "broken.wav").write_bytes(b"RIFF not really")
    model, extra = setup(checkpoint, voices)
    result = run_cli("duplex_server.cli", "serve", "--port", "0", "--model", *model, *extra)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
