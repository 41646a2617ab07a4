"""What the image and video routes make of a diffusion result: MP4 files
(decoded back with PyAV) and byte ranges."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from batch_api.images import Undecodable, decode_image, encode_image
from batch_api.video_media import encode_mp4, previews
from batch_api.videos import RangeNotSatisfiable, byte_range
from duplex_server.engine.diffusion import Video


def test_an_mp4_holds_every_frame_at_its_rate():
    frames = np.zeros((12, 16, 24, 3), np.uint8)
    for index in range(12):
        frames[index, :, : 2 * index] = 255  # a bar that grows
    data = encode_mp4(Video(frames, fps=8))
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.width, stream.height) == ("h264", 24, 16)
        assert stream.average_rate == 8
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    assert len(decoded) == 12
    bright = [int((frame[8, :, 0] > 128).sum()) for frame in decoded]
    assert bright == sorted(bright) and bright[-1] > bright[0]


def test_previews_are_the_first_frame_and_a_grid_of_frames_through_the_video():
    from PIL import Image

    frames = np.zeros((40, 16, 24, 3), np.uint8)
    for index in range(40):
        frames[index] = index * 6  # darker to lighter
    made = previews(encode_mp4(Video(frames, fps=8)))
    assert {name: media for name, (_, media) in made.items()} == {
        "thumbnail": "image/webp",
        "spritesheet": "image/jpeg",
    }
    with Image.open(io.BytesIO(made["thumbnail"][0])) as thumbnail:
        assert (thumbnail.format, thumbnail.size) == ("WEBP", (24, 16))
        assert max(thumbnail.convert("L").getdata()) < 20  # the first, darkest frame
    with Image.open(io.BytesIO(made["spritesheet"][0])) as sheet:
        assert (sheet.format, sheet.size) == ("JPEG", (4 * 24, 4 * 16))  # 16 of 40 frames
        grey = np.asarray(sheet.convert("L"), np.int16)
    tiles = [int(grey[8 + 16 * (i // 4), 12 + 24 * (i % 4)]) for i in range(16)]
    assert tiles == sorted(tiles) and tiles[-1] - tiles[0] > 180  # first frame to last


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-99", (0, 99)),
        ("bytes=100-", (100, 999)),
        ("bytes=-10", (990, 999)),
        ("bytes=-5000", (0, 999)),
        ("bytes=900-5000", (900, 999)),
        ("items=0-1", None),
        ("bytes=0-1,5-6", None),
    ],
)
def test_byte_ranges(header, expected):
    assert byte_range(header, 1000) == expected


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=5-4", "bytes=-0"])
def test_unsatisfiable_ranges(header):
    with pytest.raises(RangeNotSatisfiable):
        byte_range(header, 1000)


@pytest.mark.parametrize("output_format", ["png", "jpeg", "webp"])
def test_pictures_encode_in_the_asked_format(output_format):
    from PIL import Image

    pixels = np.zeros((16, 24, 3), np.uint8)
    pixels[:, 12:] = (200, 30, 30)
    data = encode_image(pixels, output_format)
    with Image.open(io.BytesIO(data)) as image:
        assert (image.format, image.size) == (output_format.upper(), (24, 16))
        back = np.asarray(image.convert("RGB")).astype(int)
    assert np.abs(back - pixels).max() <= (0 if output_format == "png" else 40)


def test_uploads_decode_and_masks_read_transparency():
    from PIL import Image

    rgba = Image.new("RGBA", (8, 8), (10, 20, 30, 255))
    rgba.paste((0, 0, 0, 0), (0, 0, 8, 4))  # transparent top half: paint there
    out = io.BytesIO()
    rgba.save(out, format="PNG")
    assert decode_image(out.getvalue()).shape == (8, 8, 3)
    mask = decode_image(out.getvalue(), mask=True)
    assert mask[:4].min() == 255 and mask[4:].max() == 0
    with pytest.raises(Undecodable):
        decode_image(b"not a picture")
