"""OpenAI's REST parameters through the stock openai SDK against a real
server: what is honoured works as the SDK expects (image ``quality`` as
denoising steps, ``stream=True`` events, a ``server_vad`` chunking
strategy), what is refused is 400 ``unsupported_value`` naming the
parameter, and ``/v1/models`` parses as the SDK's ``Model``."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
from PIL import Image

from duplex_server.audio.containers import encode
from duplex_server.sessions.core import records as r
from tests.batch_helpers import batch_server, client
from tests.e2e.test_images import image_model, png  # noqa: F401  (the module's fixture)
from tests.speech import silence, speak

STEPS = {"num_inference_steps": 2}


@pytest.fixture
async def images_server(image_model, tmp_path):  # noqa: F811
    async with batch_server(f"sqlite:{tmp_path / 's.db'}", image_model=image_model) as s:
        yield s


@pytest.fixture
async def audio_server(tmp_path):
    async with batch_server("memory", blob_dir=str(tmp_path / "b"), asr="pocketsphinx") as s:
        yield s


def _decoded(b64: str) -> Image.Image:
    import base64

    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


async def _progress_records(server) -> list[int]:
    """Per job, how many denoising steps it logged (oldest job first)."""
    log = server.app.state.log
    jobs = [row for row in await log.sessions() if r.is_job_session(row.session_id)]
    counts = []
    for job in jobs:
        records = await log.read(job.session_id)
        counts.append(sum(isinstance(record.body, r.ProgressBody) for record in records))
    return counts


async def test_quality_low_runs_fewer_steps_than_high(images_server):
    sdk = client(images_server)
    low = await sdk.images.generate(prompt="a cat", size="16x16", quality="low")
    assert low.quality == "low" and low.background == "opaque"
    await sdk.images.generate(prompt="a cat", size="16x16", quality="medium", background="auto")
    assert sorted(await _progress_records(images_server)) == [10, 20]


async def test_a_streamed_generation_is_openais_events(images_server):
    stream = await client(images_server).images.generate(
        prompt="a red boat",
        size="16x16",
        n=2,
        stream=True,
        partial_images=0,
        output_format="jpeg",
        extra_body=STEPS,
    )
    events = [event async for event in stream]
    assert [event.type for event in events] == ["image_generation.completed"] * 2
    for event in events:
        assert isinstance(event, openai.types.ImageGenCompletedEvent)
        assert _decoded(event.b64_json).format == "JPEG"
        assert (event.size, event.output_format, event.background) == ("16x16", "jpeg", "opaque")


async def test_a_streamed_edit_is_openais_events(images_server):
    source = np.zeros((16, 16, 3), np.uint8)
    stream = await client(images_server).images.edit(
        image=("source.png", png(source), "image/png"),
        prompt="a sunset",
        size="16x16",
        stream=True,
        extra_body=STEPS,
    )
    events = [event async for event in stream]
    assert [event.type for event in events] == ["image_edit.completed"]
    assert _decoded(events[0].b64_json).size == (16, 16)


@pytest.mark.parametrize(
    ("args", "param"),
    [
        ({"background": "transparent"}, "background"),
        ({"style": "vivid"}, "style"),
        ({"stream": True, "partial_images": 2}, "partial_images"),
        ({"output_format": "gif", "frame_count": 4}, "frame_count"),
        ({"quality": "hd"}, "quality"),
    ],
)
async def test_image_parameters_the_pipeline_cannot_honour_are_refused(images_server, args, param):
    with pytest.raises(openai.BadRequestError) as refused:
        await client(images_server).images.generate(prompt="a cat", size="16x16", **args)
    assert refused.value.body["code"] == "unsupported_value"  # type: ignore[index]
    assert refused.value.body["param"] == param  # type: ignore[index]
    assert not await _progress_records(images_server)  # nothing ran


async def test_an_edits_input_fidelity_and_markup_are_refused(images_server):
    source = ("source.png", png(np.zeros((16, 16, 3), np.uint8)), "image/png")
    sdk = client(images_server)
    for args, param in [
        ({"input_fidelity": "high"}, "input_fidelity"),
        ({"markup": source}, "markup"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.images.edit(image=source, prompt="x", size="16x16", **args)
        assert refused.value.body["code"] == "unsupported_value"  # type: ignore[index]
        assert refused.value.body["param"] == param  # type: ignore[index]


def _speech_wav() -> bytes:
    pcm = silence(300, 16_000) + speak("hello there", 16_000) + silence(300, 16_000)
    return encode(pcm, "wav", 16_000)


async def test_transcription_chunking_strategies(audio_server):
    sdk = client(audio_server)
    wav = ("a.wav", _speech_wav())
    for strategy in ("auto", {"type": "server_vad"}):
        heard = await sdk.audio.transcriptions.create(
            model="whisper-1", file=wav, chunking_strategy=strategy, language="en"
        )
        assert heard.text.strip()
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.audio.transcriptions.create(
            model="whisper-1",
            file=wav,
            chunking_strategy={"type": "server_vad", "silence_duration_ms": 900},
        )
    assert refused.value.body["code"] == "unsupported_value"  # type: ignore[index]
    assert refused.value.body["param"] == "chunking_strategy"  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "param"),
    [
        ({"include": ["logprobs"]}, "include"),
        ({"known_speaker_names": ["agent"], "known_speaker_references": ["data:,"]},
         "known_speaker_names"),
        ({"response_format": "diarized_json"}, "response_format"),
        ({"languages": ["en", "de"]}, "languages"),
    ],
)  # fmt: skip
async def test_transcription_parameters_the_recogniser_cannot_honour(audio_server, args, param):
    with pytest.raises(openai.BadRequestError) as refused:
        await client(audio_server).audio.transcriptions.create(
            model="whisper-1", file=("a.wav", _speech_wav()), **args
        )
    assert refused.value.body["code"] == "unsupported_value"  # type: ignore[index]
    assert refused.value.body["param"] == param  # type: ignore[index]


async def test_the_models_list_parses_with_each_models_aliases(audio_server):
    listed = [model async for model in client(audio_server).models.list()]
    assert all(isinstance(model, openai.types.Model) for model in listed)
    assert all(model.object == "model" and model.owned_by for model in listed)
    served = listed[0].model_dump()
    assert served["parent"] is None
    assert served["aliases"] == [model.id for model in listed[1:]]
    assert {model.model_dump()["parent"] for model in listed[1:]} == {listed[0].id}
