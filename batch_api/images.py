"""``POST /v1/images/generations`` and ``/v1/images/edits`` on a diffusers
pipeline (``--image-model``): OpenAI's request and response bodies, the
pictures base64 in ``data[].b64_json``."""

from __future__ import annotations

import io

import numpy as np

from duplex_server.engine.diffusion.jobs import Pixels

# output_format -> (Pillow's format name, content type)
OUTPUT_FORMATS = {
    "png": ("PNG", "image/png"),
    "jpeg": ("JPEG", "image/jpeg"),
    "webp": ("WEBP", "image/webp"),
}
MAX_UPLOAD_PIXELS = 4096 * 4096  # a decoded upload (a small file can claim a huge picture)


class Undecodable(ValueError):
    """An upload no image decoder reads."""


def encode_image(pixels: Pixels, output_format: str, compression: int | None = None) -> bytes:
    """``compression`` (0-100, OpenAI's ``output_compression``): how much
    smaller a JPEG or WebP may get at the cost of detail; PNG is lossless."""
    from PIL import Image

    name, _ = OUTPUT_FORMATS[output_format]
    options: dict[str, object] = {}
    if name != "PNG":
        options["quality"] = 100 - (compression if compression is not None else 25)
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
