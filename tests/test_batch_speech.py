"""POST /v1/audio/speech through the stock openai SDK against a real server
(uvicorn in this process), on every log backend: every format encoded and
decodable, idempotent retries served from the log, the job's records, and
bad input refused by name with nothing left in the blob store."""

from __future__ import annotations

import asyncio
import base64
import json

import msgspec
import openai
import pytest

from duplex_server.audio.containers import decode
from duplex_server.sessions.core import records as r
from tests.batch_helpers import batch_server, blob_files, client, decoded, store_spec

TEXT = "Hello there. This is a batch speech job, spoken by the server."


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def server(request, tmp_path):
    redis_url = request.getfixturevalue("redis_server").url if request.param == "redis" else None
    store, overrides = store_spec(request.param, tmp_path, redis_url)
    async with batch_server(store, **overrides) as running:
        yield running


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
async def test_every_format_decodes_to_the_speech(tmp_path, fmt):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        speech = await client(server).audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT, response_format=fmt
        )
    samples, rate, _ = decoded(speech.content)
    assert rate == (48_000 if fmt == "opus" else 24_000)
    assert 2.0 < samples / rate < 10.0  # a dozen words, spoken


async def test_pcm_is_raw_24khz_and_the_same_speech_as_wav(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        sdk = client(server)
        pcm = await sdk.audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="pcm"
        )
        wav = await sdk.audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="wav"
        )
    assert wav.content[:4] == b"RIFF"
    wav_s = len(decode(wav.content, 24_000, 60)) / 2 / 24_000
    assert abs(len(pcm.content) / 2 / 24_000 - wav_s) < 0.05 * wav_s  # 16-bit mono at 24 kHz


async def test_sample_rate_and_speed_are_honoured(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        sdk = client(server)
        normal = await sdk.audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="wav"
        )
        fast = await sdk.audio.speech.create(
            model="tts-1",
            voice="alloy",
            input=TEXT,
            response_format="wav",
            speed=2.0,
            extra_body={"sample_rate": 16_000},
        )
    normal_samples, normal_rate, _ = decoded(normal.content)
    fast_samples, fast_rate, _ = decoded(fast.content)
    assert (normal_rate, fast_rate) == (24_000, 16_000)
    assert fast_samples / fast_rate < 0.7 * normal_samples / normal_rate


async def test_a_retry_with_the_same_key_is_the_stored_result_not_a_new_run(server):
    sdk = client(server)
    runner = server.app.state.batch.runner
    speech = server.app.state.batch.audio.speech
    headers = {"Idempotency-Key": "order-17"}
    first = await sdk.audio.speech.with_raw_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="mp3", extra_headers=headers
    )
    runs, executions = speech.runs, runner.executions
    assert runs > 0  # the first request was synthesised, clause by clause
    again = await sdk.audio.speech.with_raw_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="mp3", extra_headers=headers
    )
    assert again.content == first.content
    assert (speech.runs, runner.executions) == (runs, executions)  # nothing synthesised
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    job_id = first.headers["x-duplex-job-id"]
    assert again.headers["x-duplex-job-id"] == job_id

    records = await server.app.state.log.read(job_id)
    assert [rec.kind for rec in records] == ["config", "job", "result", "close"]
    job, result = records[1].body, records[2].body
    assert isinstance(job, r.JobBody) and isinstance(result, r.ResultBody)
    assert msgspec.json.decode(job.params)["input"] == TEXT
    assert job.idempotency_key == "order-17"
    assert result.status == "completed" and result.output is not None
    assert result.output.size == len(first.content)
    stored = server.app.state.batch.blobs.path(result.output.digest).read_bytes()
    assert stored == first.content

    # Another body under the same key: refused, nothing run.
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        await sdk.audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT + " More.", extra_headers=headers
        )
    assert refused.value.body["code"] == "idempotency_key_reused"  # type: ignore[index]
    assert refused.value.body["param"] == "Idempotency-Key"  # type: ignore[index]
    assert runner.executions == executions


async def test_concurrent_requests_under_one_key_run_once(server):
    sdk = client(server)
    runner = server.app.state.batch.runner
    before = runner.executions
    headers = {"Idempotency-Key": "same-time"}
    bodies = await asyncio.gather(
        *(
            sdk.audio.speech.create(
                model="tts-1",
                voice="alloy",
                input=TEXT,
                response_format="wav",
                extra_headers=headers,
            )
            for _ in range(3)
        )
    )
    assert len({b.content for b in bodies}) == 1
    assert runner.executions == before + 1


async def test_the_key_is_scoped_to_the_principal(tmp_path):
    from duplex_server.auth import new_key_entry

    keys = tmp_path / "keys.jsonl"
    made = [new_key_entry(name, ["batch"], 0) for name in ("alice", "bob")]
    keys.write_text("".join(line + "\n" for _, line in made))
    async with batch_server(
        "memory", blob_dir=str(tmp_path / "blobs"), api_keys_file=str(keys)
    ) as server:
        headers = {"Idempotency-Key": "shared-name"}
        alice, bob = (client(server, key) for key, _ in made)
        a = await alice.audio.speech.with_raw_response.create(
            model="tts-1", voice="alloy", input=TEXT, extra_headers=headers
        )
        # Bob's request under the same key is his own job, with his own body.
        b = await bob.audio.speech.with_raw_response.create(
            model="tts-1", voice="echo", input="Something else entirely.", extra_headers=headers
        )
        assert a.headers["x-duplex-job-id"] != b.headers["x-duplex-job-id"]
        assert "idempotent-replayed" not in b.headers
        # and the log of Alice's job is hers alone
        status = await bob._client.get(
            f"{server.http_url}/v1/sessions/{a.headers['x-duplex-job-id']}/events",
            headers={"Authorization": f"Bearer {made[1][0]}"},
        )
        assert status.status_code == 403
        with pytest.raises(openai.AuthenticationError):
            await client(server, "dsk_not_a_key_at_all").audio.speech.create(
                model="tts-1", voice="alloy", input=TEXT
            )


BAD = [
    ({"input": ""}, 400, "string_below_min_length", "input"),
    ({"input": "a" * 4097}, 400, "string_above_max_length", "input"),
    ({"voice": "nobody"}, 400, "invalid_value", "voice"),
    ({"response_format": "ogg"}, 400, "invalid_value", "response_format"),
    ({"stream_format": "chunks"}, 400, "invalid_value", "stream_format"),
    ({"speed": 9.0}, 400, "invalid_value", "speed"),
    ({"sample_rate": 44_100, "response_format": "opus"}, 400, "invalid_value", "sample_rate"),
    ({"instructions": "whisper it"}, 400, "unsupported_value", "instructions"),
    ({"task_type": "VoiceDesign"}, 400, "unsupported_value", "task_type"),
    ({"ref_audio": "data:audio/wav;base64,AAAA"}, 400, "unsupported_value", "ref_audio"),
    ({"language": "German"}, 400, "unsupported_value", "language"),
    ({"temperature": 0.3}, 400, "unknown_parameter", "temperature"),
    ({"seed": 7}, 400, "unsupported_value", "seed"),
    ({"speed": "fast"}, 400, "invalid_type", "speed"),
    ({"model": "gpt-9-tts"}, 404, "model_not_found", "model"),
]


@pytest.mark.parametrize(("change", "status", "code", "param"), BAD)
async def test_bad_input_is_refused_by_name_and_writes_nothing(
    tmp_path, change, status, code, param
):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        body = {"model": "tts-1", "voice": "alloy", "input": TEXT} | change
        async with client(server) as sdk:
            refused = await sdk._client.post(f"{server.http_url}/v1/audio/speech", json=body)
            assert refused.status_code == status, refused.text
            error = refused.json()["error"]
            assert (error["code"], error["param"]) == (code, param)
            assert error["type"] == "invalid_request_error" and error["message"]
            assert blob_files(server) == []
            assert not [
                s for s in await server.app.state.log.sessions() if r.is_job_session(s.session_id)
            ]
            # and the server keeps serving
            ok = await sdk.audio.speech.create(model="tts-1", voice="alloy", input="Still here.")
            assert ok.content


async def test_a_language_the_voice_speaks_is_taken(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        speech = await client(server).audio.speech.create(
            model="tts-1",
            voice="alloy",
            input=TEXT,
            extra_body={"language": "English", "task_type": "CustomVoice"},
        )
    assert decoded(speech.content)[0] > 0


async def test_a_server_without_a_synthesiser_says_so(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs"), model="echo") as server:
        with pytest.raises(openai.NotFoundError) as refused:
            await client(server).audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
    error = refused.value.body
    assert error["code"] == "model_not_loaded" and error["param"] == "model"  # type: ignore[index]
    assert "--model echo" in error["message"]  # type: ignore[index]


LONG = " ".join(f"This is sentence number {n} of a longer text." for n in range(1, 16))


async def test_stream_format_audio_sends_the_file_as_it_is_synthesised(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        runner = server.app.state.batch.runner
        chunks, in_flight_at_first = [], None
        async with client(server).audio.speech.with_streaming_response.create(
            model="tts-1",
            voice="alloy",
            input=LONG,
            response_format="wav",
            stream_format="audio",
            extra_headers={"Idempotency-Key": "streamed"},
        ) as response:
            assert response.headers["content-type"] == "audio/wav"
            async for chunk in response.iter_bytes():
                if in_flight_at_first is None:
                    in_flight_at_first = bool(runner.runs)
                chunks.append(chunk)
        assert in_flight_at_first  # the first bytes came while the job still ran
        body = b"".join(chunks)
        assert body[:4] == b"RIFF" and body[4:8] == b"\xff\xff\xff\xff"  # length unknown
        assert decoded(body)[0] / 24_000 > 10
        # the stored result is the streamed body, byte for byte
        again = await client(server).audio.speech.with_raw_response.create(
            model="tts-1",
            voice="alloy",
            input=LONG,
            response_format="wav",
            stream_format="audio",
            extra_headers={"Idempotency-Key": "streamed"},
        )
        assert again.content == body and again.headers["idempotent-replayed"] == "true"


async def test_stream_format_sse_sends_openai_delta_and_done_events(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        events = []
        async with client(server).audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=LONG, response_format="pcm", stream_format="sse"
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line.removeprefix("data: ")))
    types = [e["type"] for e in events]
    assert types[-1] == "speech.audio.done" and set(types[:-1]) == {"speech.audio.delta"}
    assert len(types) > 3  # clause by clause
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(pcm) / 2 / 24_000 > 10
    usage = events[-1]["usage"]
    assert usage["input_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"]


async def test_a_streamed_request_that_is_refused_gets_its_error_not_a_200(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        with pytest.raises(openai.BadRequestError) as refused:
            async with client(server).audio.speech.with_streaming_response.create(
                model="tts-1", voice="nobody", input=LONG, stream_format="audio"
            ):
                pass
    assert refused.value.body["param"] == "voice"  # type: ignore[index]


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
async def test_every_format_streams_as_a_decodable_file(tmp_path, fmt):
    async with batch_server("memory", blob_dir=str(tmp_path / "blobs")) as server:
        stream = client(server).audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=LONG, response_format=fmt, stream_format="audio"
        )
        async with stream as response:
            chunks = [chunk async for chunk in response.iter_bytes()]
    samples, rate, _ = decoded(b"".join(chunks))
    assert rate == (48_000 if fmt == "opus" else 24_000)
    assert samples / rate > 10


async def test_a_seed_pins_vits_speech(tmp_path):
    """VITS samples its durations and prior: unseeded, two runs differ; under
    one seed they are the same bytes, computed afresh (no key, no replay)."""
    from tests.tiny_models import tiny_vits

    vits = tiny_vits(tmp_path / "vits")
    async with batch_server(
        "memory", blob_dir=str(tmp_path / "blobs"), tts=f"vits:{vits}"
    ) as server:
        sdk = client(server)

        async def speak(seed: int | None) -> bytes:
            extra = {} if seed is None else {"seed": seed}
            speech = await sdk.audio.speech.create(
                model="tts-1", voice="alloy", input=TEXT, response_format="pcm", extra_body=extra
            )
            return speech.content

        first, again, other = await speak(7), await speak(7), await speak(8)
        unseeded = {await speak(None), await speak(None)}
        assert server.app.state.batch.runner.executions == 5
    assert first == again and len(first) > 0
    assert other != first
    assert len(unseeded) == 2  # without a seed the sampler's noise differs
