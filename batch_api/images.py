"""``POST /v1/images/generations`` and ``/v1/images/edits`` on a diffusers
pipeline (``--image-model``): OpenAI's request and response bodies, the
pictures base64 in ``data[].b64_json``.

Each request is a one-shot job (duplex_server/jobs): the validated request
and the uploads are its records, the diffusion engine paints at batch
priority with per-step progress, the response body is its stored result,
so an ``Idempotency-Key`` retry gets the same bytes and a job cut off by a
crash runs again after the restart. The seed, when the client sets none,
comes from the job's id: a rerun paints the same pictures.

Every parameter of OpenAI's images API is a field of :class:`ImageRequest`
(``quality`` picks the denoising steps, ``stream`` answers OpenAI's
``*.completed`` events, one per picture) or a row of :data:`REFUSED`,
answered ``unsupported_value`` with why. ``partial_images`` above 0 is
refused too: the engine reports steps, not the pictures between them."""

from __future__ import annotations

import hashlib
import io
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import numpy as np
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from batch_api.http import (
    answer,
    decode_struct,
    error_response,
    form_name,
    idempotency_key,
    job_headers,
    principal_name,
    read_json,
    streamed,
    unsupported,
)
from duplex_server.config import ServerConfig
from duplex_server.engine.diffusion import (
    DiffusionEngine,
    ImageJob,
    Images,
    PipelineInfo,
    PipelineLoadError,
    Step,
    load_diffusion,
)
from duplex_server.engine.diffusion.jobs import Pixels
from duplex_server.http_body import BodyTooLarge, limited_stream
from duplex_server.jobs.run import JobError, JobInput, JobKind, JobRequest, JobRun
from duplex_server.jobs.runner import JobRunner

ROUTE_GENERATIONS = "/v1/images/generations"
ROUTE_EDITS = "/v1/images/edits"
# output_format -> (Pillow's format name, content type)
OUTPUT_FORMATS = {
    "png": ("PNG", "image/png"),
    "jpeg": ("JPEG", "image/jpeg"),
    "webp": ("WEBP", "image/webp"),
}
MAX_UPLOAD_PIXELS = 4096 * 4096  # a decoded upload (a small file can claim a huge picture)
MAX_PROMPT_CHARS = 4_000
MAX_IMAGES = 4  # n
MAX_STEPS = 200
MAX_GUIDANCE = 50.0
MAX_FORM_FIELDS = 16
MAX_FIELD_BYTES = 64 * 1024  # a form field that is not a file (a prompt)


class Undecodable(ValueError):
    """An upload no image decoder reads."""


class ImageRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Both routes' fields (an edit's pictures travel as uploads). OpenAI's
    fields this server cannot honour are in :data:`REFUSED`, not here."""

    prompt: str
    model: str | None = None
    n: int = 1
    size: str = "auto"
    quality: str = "auto"  # -> denoising steps (QUALITY_STEPS)
    background: str = "auto"  # a diffusion pipeline paints every pixel: auto is opaque
    moderation: str = "auto"  # no content filter runs here: auto and low are the same
    response_format: str = "b64_json"
    output_format: str = "png"
    output_compression: int | None = None
    stream: bool = False
    partial_images: int | None = None
    seed: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    user: str | None = None  # OpenAI's end-user id: kept in the job's record, nothing else
    safety_identifier: str | None = None  # the same, its newer name


# OpenAI's image parameters this server refuses whenever they are sent, and why.
REFUSED = {
    "style": "vivid/natural was DALL-E 3's; describe the style in the prompt",
    "complexity": "the diffusion pipeline has no complexity setting; use quality",
    "frame_count": "GIF output is not made here (output_format png, jpeg or webp)",
    "frame_duration_ms": "GIF output is not made here (output_format png, jpeg or webp)",
    "svg": "SVG output is not made here (output_format png, jpeg or webp)",
    "input_fidelity": "the edit pipeline has no input fidelity control",
    "markup": "the edit pipeline takes a mask, not a markup picture",
}
UPLOADS = ("image", "mask")  # an edit's files: the job's uploads, not request fields
# quality -> denoising steps (num_inference_steps, when given, wins over auto)
QUALITY_STEPS = {"low": 10, "medium": 20, "high": 30, "xhigh": 50, "max": 80, "auto": 30}
BACKGROUNDS = ("auto", "opaque")
MODERATIONS = ("auto", "low")


def _invalid(param: str, message: str, code: str = "invalid_value") -> JobError:
    return JobError(400, code, message, param)


def parse_size(size: str, info: PipelineInfo) -> tuple[int, int]:
    if size == "auto":
        return info.default_size
    width, sep, height = size.partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise _invalid("size", f"size {size!r} is not WIDTHxHEIGHT or auto")
    problem = info.size_problem(int(width), int(height))
    if problem is not None:
        raise _invalid("size", f"{info.name} cannot make {size}: {problem}")
    return int(width), int(height)


def validate(req: ImageRequest, info: PipelineInfo) -> ImageRequest:
    """The request as the job runs it (``size`` resolved), or the 4xx."""
    if req.model is not None and req.model != info.name:
        raise JobError(
            404, "model_not_found", f"model {req.model!r} is not served; {info.name!r} is", "model"
        )
    if not req.prompt.strip() or len(req.prompt) > MAX_PROMPT_CHARS:
        raise _invalid("prompt", f"prompt must be 1 to {MAX_PROMPT_CHARS} characters")
    if not 1 <= req.n <= MAX_IMAGES:
        raise _invalid("n", f"n must be 1 to {MAX_IMAGES}")
    if req.response_format != "b64_json":
        raise _invalid(
            "response_format",
            f"response_format {req.response_format!r}: only b64_json (this server hosts no URLs)",
            "unsupported_value",
        )
    if req.output_format not in OUTPUT_FORMATS:
        raise _invalid(
            "output_format",
            f"output_format {req.output_format!r}: one of {', '.join(OUTPUT_FORMATS)}",
        )
    if req.output_compression is not None:
        if req.output_format == "png":
            raise _invalid(
                "output_compression", "png is lossless: output_compression is for jpeg and webp"
            )
        if not 0 <= req.output_compression <= 100:
            raise _invalid("output_compression", "output_compression must be 0 to 100")
    if req.num_inference_steps is not None and not 1 <= req.num_inference_steps <= MAX_STEPS:
        raise _invalid("num_inference_steps", f"num_inference_steps must be 1 to {MAX_STEPS}")
    _check_openai_options(req)
    if req.guidance_scale is not None and not 0.0 <= req.guidance_scale <= MAX_GUIDANCE:
        raise _invalid("guidance_scale", f"guidance_scale must be 0 to {MAX_GUIDANCE}")
    if req.negative_prompt is not None:
        if not info.negative_prompt:
            raise _invalid(
                "negative_prompt", f"{info.pipeline} takes no negative prompt", "unsupported_value"
            )
        if len(req.negative_prompt) > MAX_PROMPT_CHARS:
            raise _invalid("negative_prompt", f"at most {MAX_PROMPT_CHARS} characters")
    if req.seed is not None and not 0 <= req.seed < 2**63:
        raise _invalid("seed", "seed must be 0 to 2**63 - 1")
    width, height = parse_size(req.size, info)
    return msgspec.structs.replace(req, size=f"{width}x{height}")


def _check_openai_options(req: ImageRequest) -> None:
    """quality, background, moderation, stream and partial_images."""
    if req.quality in ("standard", "hd"):
        raise _invalid(
            "quality",
            f"quality {req.quality!r} was DALL-E's; one of {', '.join(QUALITY_STEPS)}",
            "unsupported_value",
        )
    if req.quality not in QUALITY_STEPS:
        raise _invalid("quality", f"quality {req.quality!r}: one of {', '.join(QUALITY_STEPS)}")
    if req.quality != "auto" and req.num_inference_steps is not None:
        raise _invalid(
            "quality", "quality sets the denoising steps: send it or num_inference_steps, not both"
        )
    if req.background == "transparent":
        raise _invalid(
            "background",
            "a diffusion pipeline paints every pixel: no transparent background (auto or opaque)",
            "unsupported_value",
        )
    if req.background not in BACKGROUNDS:
        raise _invalid("background", f"background {req.background!r}: auto or opaque")
    if req.moderation not in MODERATIONS:
        raise _invalid("moderation", f"moderation {req.moderation!r}: auto or low")
    if req.partial_images is not None:
        if not 0 <= req.partial_images <= 3:
            raise _invalid("partial_images", "partial_images must be 0 to 3")
        if req.partial_images > 0:
            raise _invalid(
                "partial_images",
                "the diffusion engine reports its steps, not pictures between them: "
                "partial_images 0 (each picture in one event when done)",
                "unsupported_value",
            )


def steps_of(req: ImageRequest) -> int:
    """The denoising steps the job runs: num_inference_steps, else quality's."""
    return req.num_inference_steps or QUALITY_STEPS[req.quality]


def job_seed(job_id: str) -> int:
    """A seed for a job whose client set none: its id's, so a rerun matches."""
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big") >> 1


# zlib's fastest level: a 512 px photograph encodes in a quarter of the time
# of Pillow's default (6) for about 7 % more bytes (measured: 18 against 71 ms,
# 425 against 396 KiB); the encode is on every image's path to the client.
PNG_ZLIB_LEVEL = 1


def encode_image(pixels: Pixels, output_format: str, compression: int | None = None) -> bytes:
    """``compression`` (0-100, OpenAI's ``output_compression``): how much
    smaller a JPEG or WebP may get at the cost of detail; PNG is lossless."""
    from PIL import Image

    name, _ = OUTPUT_FORMATS[output_format]
    options: dict[str, object] = (
        {"compress_level": PNG_ZLIB_LEVEL}
        if name == "PNG"
        else {"quality": 100 - (compression if compression is not None else 25)}
    )
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=name, **options)
    return out.getvalue()


def decode_image(data: bytes, mask: bool = False) -> Pixels:
    """An uploaded picture as RGB (a mask: one channel, white where the edit
    paints; OpenAI's masks mark it with transparency, which counts as white)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > MAX_UPLOAD_PIXELS:
                raise Undecodable(
                    f"{image.width}x{image.height} is over {MAX_UPLOAD_PIXELS} pixels"
                )
            image.load()
            if not mask:
                return np.asarray(image.convert("RGB"), dtype=np.uint8)
            if "A" in image.getbands():
                return np.asarray(image.getchannel("A").point(lambda a: 255 - a), dtype=np.uint8)
            return np.asarray(image.convert("L"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise Undecodable(str(exc)) from None


def _picture(data: bytes, param: str, mask: bool = False) -> Pixels:
    try:
        return decode_image(data, mask)
    except Undecodable as exc:
        raise _invalid(param, f"{param} is not a picture this server can read: {exc}") from None


@dataclass
class ImagesApi:
    """The two routes and their job kinds, over one loaded pipeline (None:
    no ``--image-model``, and the routes say so)."""

    engine: DiffusionEngine | None
    runner: JobRunner
    max_upload_bytes: int

    @classmethod
    def build(cls, config: ServerConfig, runner: JobRunner) -> ImagesApi:
        """Starts loading ``--image-model`` (on the engine's thread) and
        registers the job kinds, so jobs a crash left can run again."""
        engine = load_diffusion(config.image_model, video=False) if config.image_model else None
        api = cls(engine, runner, config.max_upload_bytes)
        for route, produce in ((ROUTE_GENERATIONS, api._generated), (ROUTE_EDITS, api._edited)):
            runner.register(JobKind(route, produce, content_type))
        return api

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()

    @property
    def routes(self) -> list[Route]:
        return [
            Route(ROUTE_GENERATIONS, self.generations, methods=["POST"]),
            Route(ROUTE_EDITS, self.edits, methods=["POST"]),
        ]

    async def _info(self) -> PipelineInfo:
        if self.engine is None:
            raise JobError(
                404,
                "model_not_loaded",
                "no image model is loaded: serve --image-model PATH (a diffusers pipeline)",
                "model",
            )
        try:
            return await self.engine.info()
        except PipelineLoadError as exc:
            raise JobError(503, "model_not_loaded", str(exc), "model") from exc

    async def generations(self, request: Request) -> Response:
        try:
            principal = principal_name(request)
            info = await self._info()
            req = validate(await read_json(request, ImageRequest, REFUSED), info)
            run = await self.runner.submit(
                JobRequest(
                    ROUTE_GENERATIONS,
                    principal,
                    msgspec.json.encode(req),
                    idempotency_key(request),
                )
            )
        except JobError as exc:
            return error_response(exc)
        return await _respond(run, req.stream)

    async def edits(self, request: Request) -> Response:
        try:
            principal = principal_name(request)
            info = await self._info()
            if not info.edits:
                raise _invalid(
                    "image", f"{info.pipeline} cannot edit pictures", "unsupported_value"
                )
            fields, files = await self._form(request)
            req = validate(decode_struct(msgspec.json.encode(fields), ImageRequest, REFUSED), info)
            image = files.get("image")
            if image is None:
                raise JobError(400, "missing_required_parameter", "an edit needs image", "image")
            await self.runner.offload(_picture, image, "image")  # decodes: off the loop
            uploads = [(image, "application/octet-stream")]
            if "mask" in files:
                await self.runner.offload(_picture, files["mask"], "mask", True)
                uploads.append((files["mask"], "application/octet-stream"))
            run = await self.runner.submit(
                JobRequest(
                    ROUTE_EDITS,
                    principal,
                    msgspec.json.encode(req),
                    idempotency_key(request),
                    uploads,
                )
            )
        except JobError as exc:
            return error_response(exc)
        return await _respond(run, req.stream)

    async def _form(self, request: Request) -> tuple[dict[str, object], dict[str, bytes]]:
        """The multipart body's fields (numbers as numbers) and files, read
        no further than ``--max-upload-bytes``."""
        media = request.headers.get("content-type", "")
        if not media.startswith("multipart/form-data"):
            raise JobError(400, "invalid_request_body", "send multipart/form-data")
        parser = MultiPartParser(
            request.headers,
            limited_stream(request, self.max_upload_bytes),
            max_files=3,  # image, mask, and a markup to refuse by name
            max_fields=MAX_FORM_FIELDS,
            max_part_size=MAX_FIELD_BYTES,
        )
        try:
            form = await parser.parse()
        except BodyTooLarge:
            raise JobError(
                413,
                "payload_too_large",
                f"the upload is over {self.max_upload_bytes} bytes",
                "image",
            ) from None
        except MultiPartException as exc:
            raise JobError(400, "invalid_request_body", exc.message) from None
        fields: dict[str, object] = {}
        files: dict[str, bytes] = {}
        for name, value in form.multi_items():
            key = form_name(name)
            if key in REFUSED:
                raise unsupported(key, REFUSED[key])
            if isinstance(value, UploadFile):
                if key not in UPLOADS:
                    raise JobError(
                        400, "unknown_parameter", f"unrecognized request argument: {key}", key
                    )
                if key in files:
                    raise _invalid(key, f"one {key} file per edit", "unsupported_value")
                files[key] = await value.read()
            elif key in ("image", "mask"):
                raise _invalid(key, f"{key} must be a file")
            else:
                fields[key] = _form_value(key, value)
        await form.close()
        return fields, files

    def _generated(self, given: JobInput) -> AsyncIterator[bytes]:
        return self._produce(given, "image_generation")

    def _edited(self, given: JobInput) -> AsyncIterator[bytes]:
        return self._produce(given, "image_edit")

    async def _produce(self, given: JobInput, events: str) -> AsyncIterator[bytes]:
        """The response body, or with ``stream`` its SSE events (``events``:
        their type's prefix, OpenAI's ``image_generation`` or ``image_edit``)."""
        req = msgspec.json.decode(given.params, type=ImageRequest)
        info = await self._info()  # again: the server may have restarted with another model
        width, height = parse_size(req.size, info)
        # Decoding and encoding pictures is CPU work: on the jobs' pool, never the event loop.
        image = await given.offload(_picture, given.uploads[0], "image") if given.uploads else None
        mask = None
        if len(given.uploads) > 1:
            mask = await given.offload(_picture, given.uploads[1], "mask", True)
        job = ImageJob(
            prompt=req.prompt,
            width=width,
            height=height,
            steps=steps_of(req),
            seed=req.seed if req.seed is not None else job_seed(given.job_id),
            n=req.n,
            negative_prompt=req.negative_prompt,
            guidance_scale=req.guidance_scale,
            image=image,
            mask=mask,
        )
        assert self.engine is not None  # _info() refuses without one
        pictures: list[Pixels] = []
        async for chunk in self.engine.submit(given.job_id, given.job_id, job):
            if isinstance(chunk, Step):
                await given.progress(chunk.done * 100 // max(1, chunk.total), "denoising")
            elif isinstance(chunk, Images):
                pictures = chunk.images
        given.metadata.update(seed=job.seed, steps=job.steps)
        if not req.stream:
            yield await given.offload(response_body, pictures, req)
            return
        for picture in pictures:
            yield await given.offload(completed_event, picture, req, events)


def content_type(params: bytes) -> str:
    req = msgspec.json.decode(params, type=ImageRequest)
    return "text/event-stream" if req.stream else "application/json"


async def _respond(run: JobRun, stream: bool) -> Response:
    """The whole body, or (``stream``) its events as each picture is done."""
    if not stream:
        return await answer(run)
    await run.started()
    if run.outcome is not None and (run.outcome.error is not None or run.outcome.replayed):
        return await answer(run)
    return StreamingResponse(
        streamed(run, sse=True), media_type="text/event-stream", headers=job_headers(run)
    )


def _b64(picture: Pixels, req: ImageRequest) -> str:
    import base64

    return base64.b64encode(
        encode_image(picture, req.output_format, req.output_compression)
    ).decode()


def response_body(pictures: list[Pixels], req: ImageRequest) -> bytes:
    """OpenAI's images response: each picture encoded, base64 in ``b64_json``."""
    return msgspec.json.encode(
        {
            "created": int(time.time()),
            "data": [{"b64_json": _b64(p, req)} for p in pictures],
            "background": "opaque",
            "output_format": req.output_format,
            "quality": req.quality,
            "size": req.size,
        }
    )


def completed_event(picture: Pixels, req: ImageRequest, events: str) -> bytes:
    """OpenAI's ``image_generation.completed`` (``image_edit.completed``)
    SSE event for one picture. Its usage counts the prompt's words (no
    tokenizer runs here) and no image tokens."""
    words = len(req.prompt.split())
    event: dict[str, object] = {
        "type": f"{events}.completed",
        "b64_json": _b64(picture, req),
        "background": "opaque",
        "created_at": int(time.time()),
        "output_format": req.output_format,
        "quality": req.quality,
        "size": req.size,
        "usage": {
            "input_tokens": words,
            "input_tokens_details": {"image_tokens": 0, "text_tokens": words},
            "output_tokens": 0,
            "total_tokens": words,
        },
    }
    if req.safety_identifier or req.user:
        event["safety_identifier"] = req.safety_identifier or req.user
    return b"data: " + msgspec.json.encode(event) + b"\n\n"


_NUMBERS = {"n", "seed", "num_inference_steps", "output_compression", "partial_images"}


def _form_value(name: str, value: str) -> object:
    """Form fields are text: the numeric ones become numbers (else the
    request's validation names the field)."""
    if name in _NUMBERS:
        try:
            return int(value)
        except ValueError:
            return value
    if name == "stream":
        return {"true": True, "false": False}.get(value.lower(), value)
    if name == "guidance_scale":
        try:
            return float(value)
        except ValueError:
            return value
    return value
