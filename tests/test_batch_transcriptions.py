"""POST /v1/audio/transcriptions through the stock openai SDK against a real
server (uvicorn in this process) with the default recogniser (Whisper on
CTranslate2): speech spoken by eSpeak NG in several containers, every
response_format, idempotent retries of an upload, and bad uploads refused
with nothing stored."""

from __future__ import annotations

import io
import re

import av
import httpx
import numpy as np
import openai
import pytest

from duplex_server.audio.containers import encode
from duplex_server.sessions.core import records as r
from tests.batch_helpers import batch_server, blob_files, client
from tests.speech import silence, speak, speak_afresh

RATE = 16_000
# a little slower than eSpeak's default: Whisper tiny hears "good" through an mp3's artifacts
SPEED = 0.9


def two_phrases(rate: int) -> bytes:
    """Always the same audio (``speak_afresh``), whichever tests ran before."""
    pcm = silence(400, rate) + speak_afresh("good morning", rate, SPEED) + silence(1200, rate)
    return pcm + speak_afresh("what time is it", rate, SPEED) + silence(400, rate)


TWO_PHRASES = two_phrases(RATE)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def mp4(pcm16: bytes, rate: int) -> bytes:
    """AAC in an MP4 container (what phones record), written with PyAV."""
    return recorded(pcm16, rate, "mp4", "aac")


def mp3(pcm16: bytes, rate: int) -> bytes:
    """An MP3 file as a recorder writes one (128 kb/s): at the encoder's
    default rate Whisper tiny heard "good" as "not" on CI's machine."""
    return recorded(pcm16, rate, "mp3", "libmp3lame", bit_rate=128_000)


def recorded(pcm16: bytes, rate: int, fmt: str, codec: str, bit_rate: int | None = None) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "mono"  # type: ignore[union-attr]
        if bit_rate:
            stream.bit_rate = bit_rate  # type: ignore[union-attr]
        frame = av.AudioFrame.from_ndarray(
            np.frombuffer(pcm16, np.int16)[None], format="s16", layout="mono"
        )
        frame.sample_rate = rate
        for packet in stream.encode(frame):  # type: ignore[union-attr]
            container.mux(packet)
        for packet in stream.encode(None):  # type: ignore[union-attr]
            container.mux(packet)
    return out.getvalue()


@pytest.fixture
async def server(tmp_path):
    async with batch_server(
        f"sqlite:{tmp_path / 's.db'}", asr="auto", max_upload_bytes=400_000
    ) as running:
        yield running


@pytest.mark.parametrize("container", ["wav", "mp3", "flac", "opus", "mp4"])
async def test_any_container_is_heard(server, container):
    pcm = two_phrases(24_000)  # a file as a phone or a browser records it; heard at 16 kHz
    made = {"mp4": mp4, "mp3": mp3}.get(container)
    data = made(pcm, 24_000) if made else encode(pcm, container, 24_000)
    text = await client(server).audio.transcriptions.create(
        model="whisper-1", file=(f"speech.{container}", data)
    )
    assert words(text.text) == ["good", "morning", "what", "time", "is", "it"]


async def test_verbose_json_has_a_segment_per_phrase_with_its_times(server):
    result = await client(server).audio.transcriptions.create(
        model="whisper-1",
        file=("speech.wav", encode(TWO_PHRASES, "wav", RATE)),
        response_format="verbose_json",
        timestamp_granularities=["segment"],
        language="en",
    )
    assert result.language == "english"
    assert abs(result.duration - len(TWO_PHRASES) / 2 / RATE) < 0.01
    segments = result.segments or []
    assert [words(s.text) for s in segments] == [["good", "morning"], ["what", "time", "is", "it"]]
    first, second = segments
    assert 0.2 < first.start < 0.45 and first.end < second.start  # the pause between them
    assert second.end <= result.duration


async def test_text_srt_and_vtt(server):
    sdk = client(server)
    wav = ("speech.wav", encode(TWO_PHRASES, "wav", RATE))
    text = await sdk.audio.transcriptions.create(
        model="whisper-1", file=wav, response_format="text"
    )
    assert words(text) == ["good", "morning", "what", "time", "is", "it"]
    srt = await sdk.audio.transcriptions.create(model="whisper-1", file=wav, response_format="srt")
    assert re.match(r"1\n00:00:00,\d{3} --> 00:00:0\d,\d{3}\n.*\n\n2\n", srt), srt
    vtt = await sdk.audio.transcriptions.create(model="whisper-1", file=wav, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.") and "-->" in vtt


async def test_an_upload_retried_under_its_key_is_not_heard_twice(server):
    sdk = client(server)
    asr = server.app.state.batch.audio.transcriber
    wav = ("speech.wav", encode(TWO_PHRASES, "wav", RATE))
    headers = {"Idempotency-Key": "upload-1"}
    first = await sdk.audio.transcriptions.with_raw_response.create(
        model="whisper-1", file=wav, extra_headers=headers
    )
    runs = asr.runs
    assert runs == 2  # the first request was heard: one engine request per phrase
    again = await sdk.audio.transcriptions.with_raw_response.create(
        model="whisper-1", file=wav, extra_headers=headers
    )
    assert again.content == first.content and asr.runs == runs
    records = await server.app.state.log.read(first.headers["x-duplex-job-id"])
    job = records[1].body
    assert isinstance(job, r.JobBody) and job.inputs[0].size == len(wav[1])
    other = ("speech.wav", encode(speak("play some music", RATE), "wav", RATE))
    with pytest.raises(openai.UnprocessableEntityError):
        await sdk.audio.transcriptions.create(model="whisper-1", file=other, extra_headers=headers)


BAD = [
    ({"file": ("x.mp3", b"this is not audio at all" * 40)}, 400, "invalid_audio", "file"),
    ({"response_format": "docx"}, 400, "invalid_value", "response_format"),
    ({"timestamp_granularities": ["sentence"], "response_format": "verbose_json"}, 400,
     "invalid_value", "timestamp_granularities"),
    ({"stream": True, "response_format": "vtt"}, 400, "unsupported_value", "response_format"),
    ({"timestamp_granularities": ["segment"]}, 400, "invalid_value", "timestamp_granularities"),
    ({"temperature": 0.7}, 400, "unsupported_value", "temperature"),
    ({"model": "whisper-9"}, 404, "model_not_found", "model"),
    ({"extra_body": {"diarize": "true"}}, 400, "unknown_parameter", "diarize"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "status", "code", "param"), BAD)
async def test_bad_requests_are_refused_by_name_and_store_nothing(
    server, change, status, code, param
):
    args = {"model": "whisper-1", "file": ("speech.wav", encode(TWO_PHRASES, "wav", RATE))}
    sdk = client(server)
    with pytest.raises(openai.APIStatusError) as refused:
        await sdk.audio.transcriptions.create(**(args | change))
    assert refused.value.status_code == status
    error = refused.value.body
    assert (error["code"], error["param"]) == (code, param)  # type: ignore[index]
    assert blob_files(server) == []
    assert not [s for s in await server.app.state.log.sessions() if r.is_job_session(s.session_id)]
    assert (await sdk.audio.transcriptions.create(**args)).text  # still serving


async def test_an_upload_over_the_limit_is_refused_while_it_arrives(server):
    big = encode(np.zeros(RATE * 30, np.int16).tobytes(), "wav", RATE)  # ~960 kB > 400 kB
    sent = 0

    async def chunks():
        nonlocal sent
        boundary = b"--xyz\r\n"
        yield boundary + b'Content-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
        yield boundary + b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        yield b"Content-Type: audio/wav\r\n\r\n"
        for start in range(0, len(big), 16_384):
            sent += 16_384
            yield big[start : start + 16_384]
        yield b"\r\n--xyz--\r\n"

    async with httpx.AsyncClient() as http:
        refused = await http.post(  # chunked: no Content-Length to refuse it by
            f"{server.http_url}/v1/audio/transcriptions",
            content=chunks(),
            headers={"Content-Type": "multipart/form-data; boundary=xyz"},
        )
    assert refused.status_code == 413
    assert refused.json()["error"]["param"] == "file"
    assert blob_files(server) == []
    with pytest.raises(openai.APIStatusError) as declared:  # with Content-Length: at once
        await client(server).audio.transcriptions.create(model="whisper-1", file=("a.wav", big))
    assert declared.value.status_code == 413


async def test_a_server_without_a_recogniser_says_so(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "b"), model="echo") as server:
        with pytest.raises(openai.NotFoundError) as refused:
            await client(server).audio.transcriptions.create(
                model="whisper-1", file=("a.wav", encode(TWO_PHRASES, "wav", RATE))
            )
    assert refused.value.body["code"] == "model_not_loaded"  # type: ignore[index]


async def test_pocketsphinx_refuses_a_prompt(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "b"), asr="pocketsphinx") as server:
        with pytest.raises(openai.BadRequestError) as refused:
            await client(server).audio.transcriptions.create(
                model="whisper-1",
                file=("a.wav", encode(TWO_PHRASES, "wav", RATE)),
                prompt="Door words.",
            )
    assert refused.value.body["param"] == "prompt"  # type: ignore[index]
