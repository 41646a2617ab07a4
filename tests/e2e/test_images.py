"""``/v1/images/generations`` and ``/v1/images/edits`` on a real server
with a tiny Stable Diffusion pipeline built here (``--image-model``),
called through the stock openai SDK."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from duplex_server.sessions.core import records as r
from tests.batch_helpers import batch_server, client
from tests.tiny_diffusion import tiny_image_pipeline

STEPS = {"num_inference_steps": 2}


@pytest.fixture(scope="module")
def image_model(tmp_path_factory) -> str:
    return str(tiny_image_pipeline(tmp_path_factory.mktemp("tiny-sd")))


@pytest.fixture
async def server(image_model, tmp_path):
    async with batch_server(f"sqlite:{tmp_path / 'sessions.db'}", image_model=image_model) as s:
        yield s


def picture(b64: str | None) -> Image.Image:
    assert b64 is not None
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


async def test_the_sdk_generates_pictures_of_the_asked_size(server):
    result = await client(server).images.generate(
        prompt="a red cat",
        n=2,
        size="24x16",
        response_format="b64_json",
        extra_body={**STEPS, "seed": 3, "guidance_scale": 5.0, "negative_prompt": "blue"},
    )
    images = [picture(item.b64_json) for item in result.data or []]
    assert [(image.format, image.size) for image in images] == [("PNG", (24, 16))] * 2
    assert images[0].tobytes() != images[1].tobytes()
    # The job is a session on the log: what was asked, how far it came, what it made.
    log = server.app.state.log
    jobs = [row for row in await log.sessions() if r.is_job_session(row.session_id)]
    records = await log.read(jobs[0].session_id)
    kinds = [type(record.body).__name__ for record in records]
    assert kinds[:2] == ["ConfigBody", "JobBody"]
    assert kinds.count("ProgressBody") == 2 and kinds[-2:] == ["ResultBody", "CloseBody"]


async def test_the_same_seed_makes_the_same_bytes(server):
    async def generate(seed: int) -> str | None:
        result = await client(server).images.generate(
            prompt="a boat", size="16x16", extra_body={**STEPS, "seed": seed}
        )
        return (result.data or [])[0].b64_json

    first, again, other = await generate(11), await generate(11), await generate(12)
    assert first == again and first != other


@pytest.mark.parametrize(("output_format", "pil_format"), [("jpeg", "JPEG"), ("webp", "WEBP")])
async def test_output_formats(server, output_format, pil_format):
    result = await client(server).images.generate(
        prompt="a tree",
        size="16x16",
        output_format=output_format,
        output_compression=10,
        extra_body=STEPS,
    )
    assert picture((result.data or [])[0].b64_json).format == pil_format
    assert result.output_format == output_format


async def test_the_sdk_edits_a_picture_with_and_without_a_mask(server):
    source = np.zeros((16, 16, 3), np.uint8)
    source[:, 8:] = 255
    mask = np.zeros((16, 16, 4), np.uint8)
    mask[8:] = 255  # opaque bottom half kept; transparent top half painted
    sdk = client(server)
    whole = await sdk.images.edit(
        image=("source.png", png(source), "image/png"),
        prompt="a sunset",
        size="16x16",
        extra_body={**STEPS, "seed": 4},
    )
    masked = await sdk.images.edit(
        image=("source.png", png(source), "image/png"),
        mask=("mask.png", png(mask), "image/png"),
        prompt="a sunset",
        size="16x16",
        extra_body={**STEPS, "seed": 4},
    )
    first, second = (picture((x.data or [])[0].b64_json) for x in (whole, masked))
    assert first.size == second.size == (16, 16)
    assert first.tobytes() != second.tobytes()


async def test_an_idempotent_retry_gets_the_stored_bytes(server):
    body = {"prompt": "a hill", "size": "16x16", **STEPS}
    headers = {"Idempotency-Key": "image-retry-1"}
    runner = server.app.state.batch.runner
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        first = await http.post("/v1/images/generations", json=body, headers=headers)
        ran = runner.executions
        again = await http.post("/v1/images/generations", json=body, headers=headers)
        other = await http.post(
            "/v1/images/generations", json={**body, "prompt": "a lake"}, headers=headers
        )
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and runner.executions == ran
    assert again.headers["Idempotent-Replayed"] == "true"
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"size": "20x16"}, 400, "size"),
        ({"size": "4096x4096"}, 400, "size"),
        ({"size": "big"}, 400, "size"),
        ({"output_format": "gif"}, 400, "output_format"),
        ({"response_format": "url"}, 400, "response_format"),
        ({"n": 9}, 400, "n"),
        ({"num_inference_steps": 0}, 400, "num_inference_steps"),
        ({"model": "dall-e-3"}, 404, "model"),
        ({"quality": "hd"}, 400, "quality"),
        ({"prompt": ""}, 400, "prompt"),
    ],
)
async def test_bad_generations_are_refused_by_name(server, body, status, param):
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        response = await http.post(
            "/v1/images/generations", json={"prompt": "a cat", **STEPS, **body}
        )
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


async def test_an_undecodable_upload_is_refused_by_name(server):
    with pytest.raises(openai.BadRequestError) as refused:
        await client(server).images.edit(
            image=("source.png", b"not a picture", "image/png"), prompt="x", size="16x16"
        )
    assert refused.value.body["param"] == "image"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        await client(server).images.edit(
            image=("source.png", png(np.zeros((16, 16, 3), np.uint8)), "image/png"),
            mask=("mask.png", b"\x89PNG broken", "image/png"),
            prompt="x",
            size="16x16",
        )
    assert refused.value.body["param"] == "mask"  # type: ignore[index]


async def test_without_an_image_model_the_routes_say_so(tmp_path):
    async with batch_server(f"sqlite:{tmp_path / 'sessions.db'}", model="echo") as plain:
        with pytest.raises(openai.NotFoundError) as refused:
            await client(plain).images.generate(prompt="a cat")
    assert refused.value.body["code"] == "model_not_loaded"  # type: ignore[index]
    assert refused.value.body["param"] == "model"  # type: ignore[index]
