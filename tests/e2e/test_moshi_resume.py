"""Resume of a native full-duplex Moshi session after kill -9, through the
real server: ``duplex-server serve --model moshi:TINY --voices DIR`` serves
a session primed with a persona and a voice prompt, fed a fixed signal over
a real WebSocket; it is killed mid-conversation, and the session resumed
and fed the rest of the signal, two ways: a server restarted on the same
SQLite database, or a second replica on the same Redis that takes the
session over (its lease expired with the dead one). A third: a checkpoint
whose temporal window is 4 frames, killed past two windows into the call,
restarted from a snapshot: the resume prefills the whole call's units (not
the last window's), so it too continues the uninterrupted run.

The log's ``unit`` records say exactly what the model heard (the client's
frames, and the silence the server clocked while nobody spoke, the restart
included) and what it generated; the priming is the session's logged
config. The model samples (temperature 0.8), its noise drawn from the
session's seed (a function of its id) and each frame's number. The proof:
one uninterrupted run of the same checkpoint, primed with the same persona
and voice, sampling with the same seed and fed those units (a ``DuplexStepper``
in this process, the same batch shape as the server's), generates every
logged token, before and after the crash, and the audio the resumed server
sent equals its voice.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable

import numpy as np
import pytest
import websockets

from duplex_bench.tiny_moshi import FRAME_SAMPLES, tiny_moshi
from duplex_server.models import build_model
from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_moshi_wire import write_wav
from tests.e2e.test_replicas import resume
from tests.wsclient import WsClient

ROWS = 2
BEFORE = 10  # frames the client sends before the crash
AFTER = 10  # and after its resume
CRASH_AFTER_UNITS = 6  # logged units before the kill
LOAD_TIMEOUT_S = 180.0
UNITS_TIMEOUT_S = 180.0
PCM16_TOLERANCE = 2  # float32 rows rebuilt in a batch of one round alike to within this
LEASE_TTL_MS = "1000"  # a dead replica's sessions are free to take over after this
TEMPERATURE = 0.8  # it samples: its noise comes from its session's seed and frame numbers
# A call past the window: a checkpoint whose temporal window is a few frames,
# killed more than two windows in, snapshots every few records.
WRAPPED_WINDOW = 4
WRAPPED_CRASH_AFTER = 2 * WRAPPED_WINDOW + 1
WRAPPED_SNAPSHOT_EVERY = 8
PERSONA = {"instructions": "be a kind pirate", "voice": "pirate", "temperature": TEMPERATURE}


def log_lines(server: ServerProcess, session_id: str) -> list[dict]:
    url = f"{server.http_url}/v1/sessions/{session_id}/events"
    with urllib.request.urlopen(url, timeout=30) as response:
        return [json.loads(line) for line in response.read().splitlines()]


def units(lines: list[dict]) -> list[dict]:
    return [line for line in lines if line["kind"] == "unit"]


async def wait_ready(server: ServerProcess) -> None:
    """Until ``/ready`` says the model is loaded (a limit on a broken start only)."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{server.http_url}/ready", timeout=5):
                return
        except urllib.error.HTTPError:
            await asyncio.sleep(0.2)
    raise AssertionError(f"the model never loaded:\n{server.log_text()}")


async def wait_units(
    server: ServerProcess, session_id: str, done: Callable[[list[dict]], bool]
) -> list[dict]:
    """The session's log once ``done`` says its units are all there."""
    deadline = time.monotonic() + UNITS_TIMEOUT_S
    while time.monotonic() < deadline:
        lines = await asyncio.to_thread(log_lines, server, session_id)
        if done(lines):
            return lines
        await asyncio.sleep(0.1)
    raise AssertionError(f"the units never came:\n{server.log_text()}")


def heard(lines: list[dict], after_seq: int) -> list[bytes]:
    """The input of every unit logged after ``after_seq`` that was not clocked silence."""
    return [
        base64.b64decode(u["body"]["pcm"])
        for u in units(lines)
        if u["seq"] > after_seq and u["body"].get("pcm")
    ]


def signal() -> list[bytes]:
    """The user's side: speech-level noise, one pcm16 frame (80 ms at 24 kHz) each."""
    noise = np.random.default_rng(21).standard_normal((BEFORE + AFTER) * FRAME_SAMPLES) * 3000
    pcm = noise.astype("<i2").tobytes()
    return [pcm[at : at + 2 * FRAME_SAMPLES] for at in range(0, len(pcm), 2 * FRAME_SAMPLES)]


def prime_frames(checkpoint, voices) -> list:
    """The frames the server primes the session with, laid out by the same service code."""
    from duplex_server.engine.duplex.service import Prompt

    built = build_model(
        f"moshi:{checkpoint}", dtype="float32", moshi_rows=1, moshi_voices=str(voices)
    )
    service = built.service  # type: ignore[attr-defined]
    try:
        assert service.wait_loaded(LOAD_TIMEOUT_S), service.load_error
        tokens = service.prompt_tokens(PERSONA["instructions"])
        return service.prime_frames(Prompt(text_tokens=tokens, voice=PERSONA["voice"]))
    finally:
        service.close()


def uninterrupted(checkpoint, voices, logged: list[dict], session_id: str) -> list:
    """One run of the primed model over the logged units, never stopped,
    sampling as the session does (its temperature, its id's seed)."""
    import torch
    import transformers

    from duplex_server.engine.duplex.sampling import Sampling
    from duplex_server.engine.duplex.stepper import DuplexStepper
    from duplex_server.models.moshi.model import session_seed

    prefix = prime_frames(checkpoint, voices)
    assert prefix  # the persona and the voice prompt are primed
    model = transformers.MoshiForConditionalGeneration.from_pretrained(
        checkpoint, dtype=torch.float32
    ).eval()
    stepper = DuplexStepper(model, ROWS)
    row = stepper.join(prefix)
    stepper.sample(row, Sampling(TEMPERATURE, session_seed(session_id)))
    frames = []
    for unit in logged:
        body = unit["body"]
        pcm = b"" if body.get("silence") else base64.b64decode(body["pcm"])
        samples = np.zeros(FRAME_SAMPLES, np.float32)
        if pcm:
            samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
        frames.append(stepper.tick({row: samples})[row])
    return frames


def audio_by_unit(lines: list[dict], after_seq: int) -> dict[int, tuple[int, bytes]]:
    """Each audio delta journaled after ``after_seq``, by the unit it came from
    (the unit record is appended with the outputs it produced, just before them):
    unit index -> (server_event_seq, pcm16)."""
    found: dict[int, tuple[int, bytes]] = {}
    unit = None
    for line in lines:
        if line["kind"] == "unit":
            unit = line["body"]["index"]
        body = line["body"]
        if line["kind"] != "out" or body["event_type"] != "response.output_audio.delta":
            continue
        if line["seq"] > after_seq and unit is not None:
            event = json.loads(base64.b64decode(body["payload"]))
            found[unit] = (body["server_event_seq"], base64.b64decode(event["delta"]))
    return found


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_moshi(tmp_path_factory.mktemp("moshi"))


@pytest.fixture(scope="module")
def wrapped_checkpoint(tmp_path_factory):
    return tiny_moshi(tmp_path_factory.mktemp("moshi-wrapped"), window=WRAPPED_WINDOW)


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
    directory = tmp_path_factory.mktemp("voices")
    write_wav(directory / "pirate.wav", np.sin(2 * np.pi * 180 * np.arange(12_000) / 24_000) * 0.3)
    return directory


def moshi_server(store: str, checkpoint, voices, *extra: str) -> ServerProcess:
    return ServerProcess(
        store,
        *extra,
        model=f"moshi:{checkpoint}",
        voices=str(voices),
        moshi_rows=ROWS,
        dtype="float32",
    ).start(timeout_s=LOAD_TIMEOUT_S)


def replica(redis_url: str, prefix: str, name: str, checkpoint, voices) -> ServerProcess:
    lease = ("--redis-prefix", prefix, "--replica-id", name, "--lease-ttl-ms", LEASE_TTL_MS)
    return moshi_server(redis_url, checkpoint, voices, *lease)


@pytest.fixture(params=["sqlite-restart", "redis-takeover"])
def deployment(request, tmp_path, checkpoint, voices) -> Callable[[], tuple]:
    """``start()``: the first server, and a function that gives the one the
    session resumes on once the first is dead (restarted on its SQLite
    database, or the other replica on its Redis, running all along)."""
    if request.param == "sqlite-restart":
        db = f"sqlite:{tmp_path / 'moshi.db'}"

        def start_and_restart() -> tuple:
            first = moshi_server(db, checkpoint, voices)
            return first, lambda: moshi_server(db, checkpoint, voices)

        return start_and_restart
    redis_url = request.getfixturevalue("redis_server").url
    prefix = f"m{uuid.uuid4().hex[:10]}"

    def start_replicas() -> tuple:
        a = replica(redis_url, prefix, "replica-a", checkpoint, voices)
        b = replica(redis_url, prefix, "replica-b", checkpoint, voices)
        return a, lambda: b

    return start_replicas


async def test_a_moshi_session_resumed_after_kill9_continues_the_uninterrupted_run(
    deployment, checkpoint, voices
):
    await resumed_call(deployment, checkpoint, voices, CRASH_AFTER_UNITS)


async def test_a_call_past_the_window_resumed_after_kill9_continues_the_uninterrupted_run(
    tmp_path, wrapped_checkpoint, voices
):
    """The temporal window is WRAPPED_WINDOW frames and the crash comes more
    than two windows into the call (the priming before it), with snapshots
    every few records: the restart refolds from a snapshot and must still
    read back, and prefill, every unit of the call, not the last window's."""
    db = f"sqlite:{tmp_path / 'moshi.db'}"
    snapshots = ("--snapshot-every", str(WRAPPED_SNAPSHOT_EVERY))

    def start_and_restart() -> tuple:
        first = moshi_server(db, wrapped_checkpoint, voices, *snapshots)
        return first, lambda: moshi_server(db, wrapped_checkpoint, voices, *snapshots)

    lines = await resumed_call(start_and_restart, wrapped_checkpoint, voices, WRAPPED_CRASH_AFTER)
    assert any(line["kind"] == "snapshot" for line in lines)


async def resumed_call(
    deployment: Callable[[], tuple], checkpoint, voices, crash_after: int
) -> list[dict]:
    """A session killed after ``crash_after`` logged units and resumed on the
    server ``deployment`` gives: every logged token, before and after the
    crash, is the uninterrupted run's, and so is the audio sent; its log."""
    frames = signal()
    first, then = deployment()
    second: ServerProcess | None = None
    seen: list[dict] = []
    try:
        await wait_ready(first)
        client = await WsClient.connect(first.ws_url)
        created = await client.expect("session.created")
        session_id, token = created["session"]["id"], created["resume_token"]
        assert created["session"]["capabilities"]["supports_session_resume"] is True
        await client.send({"type": "session.update", "session": PERSONA})
        await client.recv_until("session.updated")
        for pcm in frames[:BEFORE]:
            await client.append(pcm)
        await wait_units(first, session_id, lambda lines: len(units(lines)) >= crash_after)
        first.kill9()  # mid-conversation: frames still queued, the model speaking
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                seen.append(await client.recv(timeout=10))
        cursor = max((e.get("server_event_seq") or 0 for e in seen), default=0)

        second = then()
        await wait_ready(second)
        again, resumed, _ = await resume(second, session_id, token, cursor)
        takeover = next(
            line["seq"]
            for line in log_lines(second, session_id)
            if line["kind"] == "lease" and line["body"]["action"] == "takeover"
        )
        for pcm in frames[BEFORE:]:
            await again.append(pcm)
        # every frame sent after the resume stepped
        lines = await wait_units(
            second,
            session_id,
            lambda lines: heard(lines, takeover)[-AFTER:] == frames[BEFORE:],
        )
        spoken = audio_by_unit(lines, takeover)
        last = max((seq for seq, _ in spoken.values()), default=cursor)
        received = await receive_through(again, last)
    finally:
        first.stop()
        if second is not None:
            second.stop()

    assert len([u for u in units(lines) if u["seq"] < takeover]) >= crash_after
    logged = units(lines)
    assert [u["body"]["index"] for u in logged] == list(range(len(logged)))  # no gap, no repeat
    after_crash = [u for u in logged if u["seq"] > takeover]
    assert len(after_crash) >= AFTER
    # What the model heard after the restart is in the log: silence clocked
    # before the resume, then the client's frames in order (and the clock's).
    assert heard(lines, takeover)[-AFTER:] == frames[BEFORE:]

    reference = uninterrupted(checkpoint, voices, logged, session_id)
    expected = [[f.tokens.text, *f.tokens.audio] for f in reference]
    assert [u["body"]["tokens"] for u in logged] == expected  # before and after the crash

    assert len(spoken) >= AFTER // 2, "the resumed model spoke"
    for index, (_, pcm) in spoken.items():
        voice = (np.clip(reference[index].samples, -1.0, 1.0) * 32767).astype("<i2")
        got = np.frombuffer(pcm, "<i2").astype(np.int32)
        np.testing.assert_allclose(got, voice.astype(np.int32), rtol=0, atol=PCM16_TOLERANCE)
    # ... and that is what went out on the resumed socket, replay and live.
    deltas = {
        e["server_event_seq"]: base64.b64decode(e["delta"])
        for e in received
        if e["type"] == "response.output_audio.delta"
    }
    assert resumed["replay_from_seq"] == cursor + 1
    for seq, pcm in spoken.values():
        assert deltas[seq] == pcm
    return lines


async def receive_through(client: WsClient, seq: int) -> list[dict]:
    """Everything the socket sent up to the journaled event ``seq``."""
    while max((e.get("server_event_seq") or 0 for e in client.received), default=0) < seq:
        await client.recv()
    return client.received
