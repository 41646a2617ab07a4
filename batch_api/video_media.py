"""The files a video job makes: the MP4 (H.264 through PyAV) and, from it,
the previews OpenAI's ``GET /v1/videos/{id}/content?variant=`` serves: a
``thumbnail`` (WebP, the first frame) and a ``spritesheet`` (JPEG, frames
evenly spaced through the video in a grid, left to right, top to bottom).

The previews are read back from the MP4, not from the pipeline's frames, so
they show what a player shows. PyAV and Pillow are imported when used."""

from __future__ import annotations

import io
import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from duplex_server.engine.diffusion import Video

if TYPE_CHECKING:
    from PIL.Image import Image

# variant -> content type (OpenAI's: the thumbnail is WebP, the spritesheet JPEG)
VARIANTS = {"video": "video/mp4", "thumbnail": "image/webp", "spritesheet": "image/jpeg"}
MAX_TILES = 16  # frames on a spritesheet (a 4x4 grid at most)
MAX_TILE_SIDE = 256  # a tile's longer side in pixels, at most
PREVIEW_QUALITY = 85


def encode_mp4(video: Video) -> bytes:
    """H.264 in MP4, its index first (``faststart``): playable while it downloads."""
    import av

    frames = video.frames
    # faststart rewrites the file to move the index: it needs a real file.
    with tempfile.TemporaryDirectory(prefix="duplex-mp4-") as scratch:
        path = Path(scratch) / "video.mp4"
        with av.open(str(path), "w", options={"movflags": "+faststart"}) as container:
            stream = container.add_stream("libx264", rate=video.fps)
            stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
            stream.pix_fmt = "yuv420p"
            for pixels in frames:
                frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
        return path.read_bytes()


def previews(mp4: bytes) -> dict[str, tuple[bytes, str]]:
    """``thumbnail`` and ``spritesheet`` (bytes, content type) of an MP4.

    Decodes the video once, keeping only the frames the spritesheet shows
    (each shrunk to a tile as it is decoded), so memory stays at a few
    tiles whatever the video's length or size."""
    first, tiles = _sampled_frames(mp4)
    return {
        "thumbnail": (_save(first, "WEBP"), VARIANTS["thumbnail"]),
        "spritesheet": (_save(_grid(tiles), "JPEG"), VARIANTS["spritesheet"]),
    }


def _sampled_frames(mp4: bytes) -> tuple[Image, list[Image]]:
    import av

    with av.open(io.BytesIO(mp4), "r") as container:
        stream = container.streams.video[0]
        total = stream.frames  # the MP4's index counts them
        wanted = _spread(total, MAX_TILES)
        first = None
        tiles = []
        for index, frame in enumerate(container.decode(stream)):
            if index == 0:
                first = frame.to_image()
            if index in wanted:
                tile = frame.to_image()
                tile.thumbnail((MAX_TILE_SIDE, MAX_TILE_SIDE))
                tiles.append(tile)
    if first is None:
        raise ValueError("the MP4 holds no frame")
    return first, tiles


def _spread(total: int, count: int) -> set[int]:
    """``count`` frame indices evenly spaced over ``total`` (all if fewer;
    the first ``count`` if the container does not say how many)."""
    if total <= count:
        return set(range(total if total > 0 else count))
    return {round(i * (total - 1) / (count - 1)) for i in range(count)}


def _grid(tiles: list[Image]) -> Image:
    from PIL import Image

    columns = math.ceil(math.sqrt(len(tiles)))
    rows = math.ceil(len(tiles) / columns)
    width, height = tiles[0].size
    sheet = Image.new("RGB", (columns * width, rows * height))
    for index, tile in enumerate(tiles):
        sheet.paste(tile, ((index % columns) * width, (index // columns) * height))
    return sheet


def _save(image: Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.convert("RGB").save(out, format=fmt, quality=PREVIEW_QUALITY)
    return out.getvalue()
