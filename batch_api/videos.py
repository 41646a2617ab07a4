"""``/v1/videos``: text-to-video as asynchronous jobs, the way OpenAI's and
vLLM-Omni's video APIs run them, on a diffusers pipeline (``--video-model``).

The finished video is an MP4 (H.264 through PyAV), served whole or by HTTP
range (a player seeks without downloading everything)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from duplex_server.engine.diffusion import Video

MP4 = "video/mp4"
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


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


class RangeNotSatisfiable(ValueError):
    """The range names no byte of the body (HTTP 416)."""


def byte_range(header: str | None, length: int) -> tuple[int, int] | None:
    """The inclusive ``(first, last)`` bytes a ``Range`` header asks for;
    None for the whole body (no header, a unit other than bytes, several
    ranges: a server may answer those whole)."""
    if header is None:
        return None
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # the last N bytes
        suffix = int(last)
        if suffix == 0 or length == 0:
            raise RangeNotSatisfiable(header)
        return max(0, length - suffix), length - 1
    start = int(first)
    end = min(int(last), length - 1) if last else length - 1
    if start >= length or (last and int(last) < start):
        raise RangeNotSatisfiable(header)
    return start, end
