"""Every REST route fuzzed from the document ``/openapi.json`` serves
(schemathesis; tests/test_openapi.py checks it is this one) against a
real server: the cascade (PocketSphinx, eSpeak NG) for the audio routes,
tiny diffusers pipelines (tests/tiny_diffusion.py) for images and videos.
No request may get a 5xx, and every 4xx body is OpenAI's error shape.

Bounded (``MAX_EXAMPLES`` an operation, derandomized, nothing written to
disk), so it costs the same every ``make test``.
"""

from __future__ import annotations

import asyncio
import io
import threading
import wave
from collections.abc import Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from batch_api.images import MAX_STEPS
from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from duplex_server.openapi import document
from tests.conftest import running_server
from tests.tiny_diffusion import tiny_image_pipeline, tiny_video_pipeline
from tests.wsclient import tone_pcm16

KEY = "sk-fuzz"
MAX_EXAMPLES = 12
schema = schemathesis.openapi.from_dict(document())
schemathesis.serializer.alias("application/sdp", "text/plain")
# What the server serves: a body that names it (or, for the pictures and
# videos, names no model) gets past the model check to the route's own
# validation, and now and then to a real job.
SERVED = {"/v1/audio/speech": "tts-1", "/v1/audio/transcriptions": "whisper-1"}
UNNAMED = ("/v1/images/generations", "/v1/images/edits", "/v1/videos", "/v1/videos/sync")


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def _wav(ms: float) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(tone_pcm16(ms, 16_000))
    return out.getvalue()


FUZZ_STEPS = 2  # a valid denoising job's steps here: jobs that run stay cheap


def cheap_steps(steps: object) -> object:
    """A valid step count becomes ``FUZZ_STEPS`` (absent: 30 steps); any
    other value stays, for the route to refuse."""
    if steps is None or (isinstance(steps, int) and FUZZ_STEPS < steps <= MAX_STEPS):
        return FUZZ_STEPS
    return steps


REAL = {"voice": "alloy", "file": _wav(300), "image": _png(), "size": "auto"}
DROP = object()  # the field left out


@schema.hook
def flatmap_body(context, body):
    """Now and then the served model (or, for pictures and videos, none),
    and a real voice, audio file, picture or size in place of the
    generated one."""
    path = context.operation.path if context.operation else ""
    if not isinstance(body, dict) or (path not in SERVED and path not in UNNAMED):
        return st.just(body)
    swaps: dict[str, object] = {key: value for key, value in REAL.items() if key in body}
    swaps["model"] = SERVED.get(path, DROP)

    def put(flags: list[bool]) -> dict:
        out = dict(body)
        for (key, value), on in zip(swaps.items(), flags, strict=True):
            if on and value is DROP:
                out.pop(key, None)
            elif on:
                out[key] = value
        if path in UNNAMED:
            out["num_inference_steps"] = cheap_steps(out.get("num_inference_steps"))
        return out

    return st.lists(st.booleans(), min_size=len(swaps), max_size=len(swaps)).map(put)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory) -> Iterator[str]:
    """The server on its own event loop in a thread: schemathesis calls it
    synchronously, from the test's thread."""
    config = ServerConfig(
        port=free_port(),
        store="memory",
        model="cascade",
        asr="pocketsphinx",
        api_key=KEY,
        blob_dir=str(tmp_path_factory.mktemp("blobs")),
        image_model=str(tiny_image_pipeline(tmp_path_factory.mktemp("tiny-sd"))),
        video_model=str(tiny_video_pipeline(tmp_path_factory.mktemp("tiny-animatediff"))),
    )
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()

    async def serve() -> None:
        try:
            async with running_server(config):
                started.set()
                await stop.wait()
        finally:
            started.set()  # a server that failed to start fails the test, not hangs it

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    try:
        started.wait()
        assert thread.is_alive(), "the server did not start (its traceback is above)"
        yield f"http://127.0.0.1:{config.port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join()
        loop.close()


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def assert_openai_error(response: schemathesis.Response, repro: str) -> None:
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(
            f"{response.status_code} body is not JSON: {repro}\n{response.text[:500]!r}"
        ) from None
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict), f"{response.status_code} without an error object: {repro}"
    missing = {"message", "type", "code", "param"} - set(error)
    assert not missing, f"{response.status_code} error lacks {sorted(missing)}: {repro}"
    assert isinstance(error["message"], str) and error["message"], repro
    assert isinstance(error["type"], str) and isinstance(error["code"], str), repro


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)
def test_no_route_fails_and_every_refusal_is_openai_shaped(case, base_url, http):
    response = case.call(
        base_url=base_url,
        session=http,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=None,  # schemathesis's 10 s default: a loaded machine is no failure
    )
    repro = case.as_curl_command()
    status = response.status_code
    assert status < 500, f"{status} from {repro}\n{response.text[:2000]}"
    if status >= 400:
        assert_openai_error(response, repro)
