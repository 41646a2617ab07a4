"""Every parameter the installed openai SDK sends to the batch routes is
known to the route: a field of its request Struct, an upload, or a row of
its refusal table (refused ``unsupported_value``, with why). A field a new
SDK adds fails here until it is honoured or refused on purpose."""

from __future__ import annotations

import json
import typing
from types import ModuleType

import msgspec
import numpy as np
import openai
import pytest
from starlette.datastructures import FormData

from batch_api import http, images, speech, transcriptions, videos
from duplex_server.engine.diffusion import PipelineInfo
from duplex_server.jobs.run import JobError
from duplex_server.sessions.core.model_names import OPENAI_REALTIME_LISTED, ModelNames


def _params(module: str, *names: str) -> set[str]:
    """The fields of the SDK's TypedDicts ``names`` in ``openai.types.module``."""
    found = __import__(f"openai.types.{module}", fromlist=["_"])
    return {field for name in names for field in typing.get_type_hints(getattr(found, name))}


SDK = [
    (
        _params(
            "image_generate_params",
            "ImageGenerateParamsNonStreaming",
            "ImageGenerateParamsStreaming",
        ),
        images.ImageRequest,
        images,
    ),
    (
        _params("image_edit_params", "ImageEditParamsNonStreaming", "ImageEditParamsStreaming"),
        images.ImageRequest,
        images,
    ),
    (
        _params(
            "audio.transcription_create_params",
            "TranscriptionCreateParamsNonStreaming",
            "TranscriptionCreateParamsStreaming",
        ),
        transcriptions.TranscriptionRequest,
        transcriptions,
    ),
    (_params("audio.speech_create_params", "SpeechCreateParams"), speech.SpeechRequest, speech),
    (_params("video_create_params", "VideoCreateParams"), videos.VideoRequest, videos),
]


def _known(struct: type[msgspec.Struct], module: ModuleType) -> tuple[set[str], set[str]]:
    fields = {field.name for field in msgspec.structs.fields(struct)}
    return fields | set(getattr(module, "UPLOADS", ())), set(module.REFUSED)


@pytest.mark.parametrize(("sdk", "struct", "module"), SDK, ids=lambda x: getattr(x, "__name__", ""))
def test_every_sdk_parameter_is_honoured_or_refused_on_purpose(sdk, struct, module):
    assert len(sdk) >= 5  # the SDK's types were found, not an empty walk
    served, refused = _known(struct, module)
    assert sdk - served - refused == set(), "a parameter OpenAI defines that the route ignores"
    assert served & refused == set(), "a parameter both served and refused"
    for param, why in module.REFUSED.items():
        assert why.strip(), param


@pytest.mark.parametrize(
    ("module", "struct", "body"),
    [
        (images, images.ImageRequest, {"prompt": "a cat"}),
        (transcriptions, transcriptions.TranscriptionRequest, {"model": "whisper-1"}),
        (videos, videos.VideoRequest, {"prompt": "a cat"}),
    ],
)
def test_a_refused_parameter_is_unsupported_value_and_an_unknown_one_unknown(module, struct, body):
    for param in module.REFUSED:
        with pytest.raises(JobError) as refused:
            http.decode_struct(json.dumps({**body, param: "x"}).encode(), struct, module.REFUSED)
        assert (refused.value.code, refused.value.param) == ("unsupported_value", param)
        assert module.REFUSED[param] in refused.value.message
    with pytest.raises(JobError) as unknown:
        http.decode_struct(json.dumps({**body, "flavour": 1}).encode(), struct, module.REFUSED)
    assert (unknown.value.code, unknown.value.param) == ("unknown_parameter", "flavour")


# --- images -------------------------------------------------------------------

INFO = PipelineInfo(
    name="tiny-sd",
    pipeline="StableDiffusionPipeline",
    video=False,
    default_size=(16, 16),
    size_multiple=8,
    max_side=64,
    edits=True,
    negative_prompt=True,
)


def _image(**fields: object) -> images.ImageRequest:
    body = json.dumps({"prompt": "a cat", **fields}).encode()
    return images.validate(http.decode_struct(body, images.ImageRequest, images.REFUSED), INFO)


def _image_refusal(**fields: object) -> tuple[str, str | None]:
    with pytest.raises(JobError) as refused:
        _image(**fields)
    return refused.value.code, refused.value.param


def test_quality_sets_the_denoising_steps():
    steps = {q: images.steps_of(_image(quality=q)) for q in ("low", "medium", "high", "auto")}
    assert steps == {"low": 10, "medium": 20, "high": 30, "auto": 30}
    assert images.steps_of(_image(quality="max")) > images.steps_of(_image(quality="xhigh")) > 30
    assert images.steps_of(_image(num_inference_steps=3)) == 3
    assert images.steps_of(_image(quality="auto", num_inference_steps=3)) == 3
    assert _image_refusal(quality="low", num_inference_steps=3) == ("invalid_value", "quality")
    assert _image_refusal(quality="hd") == ("unsupported_value", "quality")
    assert _image_refusal(quality="ultra") == ("invalid_value", "quality")


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"background": "transparent"}, "unsupported_value", "background"),
        ({"background": "pink"}, "invalid_value", "background"),
        ({"moderation": "none"}, "invalid_value", "moderation"),
        ({"stream": True, "partial_images": 2}, "unsupported_value", "partial_images"),
        ({"stream": True, "partial_images": 7}, "invalid_value", "partial_images"),
        ({"output_format": "gif"}, "invalid_value", "output_format"),
        ({"style": "vivid"}, "unsupported_value", "style"),
        ({"svg": {"model": "x"}}, "unsupported_value", "svg"),
        ({"frame_count": 4}, "unsupported_value", "frame_count"),
    ],
)
def test_image_options_the_pipeline_cannot_honour_are_refused(fields, code, param):
    assert _image_refusal(**fields) == (code, param)


def test_image_options_that_are_honoured():
    req = _image(
        background="opaque",
        moderation="low",
        stream=True,
        partial_images=0,
        safety_identifier="u-1",
        user="u-0",
    )
    assert (req.background, req.moderation, req.stream) == ("opaque", "low", True)
    assert images.content_type(msgspec.json.encode(req)) == "text/event-stream"
    assert images.content_type(msgspec.json.encode(_image())) == "application/json"


def test_the_bodies_are_what_the_sdk_parses():
    picture = np.zeros((16, 16, 3), np.uint8)
    req = _image(quality="low", output_format="webp", output_compression=20, user="u-0")
    body = openai.types.ImagesResponse.model_validate_json(images.response_body([picture], req))
    assert (body.quality, body.background, body.output_format) == ("low", "opaque", "webp")
    for prefix, event_type in [
        ("image_generation", openai.types.ImageGenCompletedEvent),
        ("image_edit", openai.types.ImageEditCompletedEvent),
    ]:
        line = images.completed_event(picture, req, prefix)
        assert line.startswith(b"data: ") and line.endswith(b"\n\n")
        event = event_type.model_validate_json(line[len(b"data: ") :])
        assert event.type == f"{prefix}.completed"
        assert (event.quality, event.size, event.safety_identifier) == ("low", "16x16", "u-0")
        assert event.usage.input_tokens == 2 and event.b64_json


def test_image_form_values_are_typed():
    assert images._form_value("stream", "true") is True
    assert images._form_value("partial_images", "0") == 0


# --- transcriptions --------------------------------------------------------------


def _heard(*items: tuple[str, str]) -> transcriptions.TranscriptionRequest:
    return transcriptions._fields(FormData([("model", "whisper-1"), *items]), "a.wav")


def _heard_refusal(*items: tuple[str, str]) -> tuple[str, str | None]:
    with pytest.raises(JobError) as refused:
        _heard(*items)
    return refused.value.code, refused.value.param


def test_chunking_strategy_auto_and_an_untuned_server_vad_are_served():
    assert _heard().chunking_strategy == "auto"
    assert _heard(("chunking_strategy", "auto")).chunking_strategy == "auto"
    vad = _heard(("chunking_strategy[type]", "server_vad"))
    assert vad.chunking_strategy == "server_vad"
    as_json = _heard(("chunking_strategy", '{"type": "server_vad"}'))
    assert as_json.chunking_strategy == "server_vad"
    tuned = _heard_refusal(
        ("chunking_strategy[type]", "server_vad"), ("chunking_strategy[threshold]", "0.7")
    )
    assert tuned == ("unsupported_value", "chunking_strategy")
    wrong = _heard_refusal(("chunking_strategy[type]", "semantic"))
    assert wrong == ("invalid_value", "chunking_strategy")


@pytest.mark.parametrize(
    "item",
    [
        ("include[]", "logprobs"),
        ("keywords[]", "duplex"),
        ("known_speaker_names[]", "agent"),
        ("known_speaker_references[]", "data:audio/wav;base64,AAAA"),
    ],
)
def test_transcription_options_no_recogniser_here_honours_are_refused(item):
    assert _heard_refusal(item) == ("unsupported_value", item[0].removesuffix("[]"))


def test_one_of_languages_is_the_language():
    req = _heard(("languages[]", "en"))
    assert transcriptions.language_of(req) == "en"
    assert transcriptions.language_of(_heard(("language", "de"))) == "de"
    assert transcriptions.language_of(_heard()) is None


# --- models ----------------------------------------------------------------------


def test_a_models_aliases_are_the_names_listed_besides_its_own():
    names = ModelNames.of("cascade", ["house", "backup"])
    assert names.aliases == OPENAI_REALTIME_LISTED
    assert names.listed() == ["house", "backup", *OPENAI_REALTIME_LISTED]
    assert ModelNames(("gpt-realtime",)).aliases == tuple(OPENAI_REALTIME_LISTED[1:])
    assert ModelNames(("echo",), openai_aliases=False).aliases == ()
