"""The diffusion backend: tiny diffusers pipelines built here, loaded from
their directories and run through the engine core step by step."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from duplex_server.engine.core import RequestAborted
from duplex_server.engine.diffusion import (
    ImageJob,
    Images,
    PipelineLoadError,
    Step,
    Video,
    VideoJob,
    load_diffusion,
)
from duplex_server.engine.diffusion.stepping import Cancelled, Progress, StepThread
from tests.tiny_diffusion import tiny_image_pipeline, tiny_video_pipeline


@pytest.fixture(scope="module")
def image_engine(tmp_path_factory):
    engine = load_diffusion(str(tiny_image_pipeline(tmp_path_factory.mktemp("image"))), False)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def video_engine(tmp_path_factory):
    engine = load_diffusion(str(tiny_video_pipeline(tmp_path_factory.mktemp("video"))), True)
    yield engine
    engine.shutdown()


async def run(engine, job, request_id="r"):
    return [chunk async for chunk in engine.submit(request_id, "s", job)]


def picture(seed: int, **fields) -> ImageJob:
    return ImageJob(
        **{"prompt": "a red cat", "width": 16, "height": 16, "steps": 3, "seed": seed, **fields}
    )


async def test_an_image_job_reports_every_step_then_its_pictures(image_engine):
    chunks = await run(image_engine, picture(1, n=2))
    assert chunks[:-1] == [Step(1, 3), Step(2, 3), Step(3, 3)]
    result = chunks[-1]
    assert isinstance(result, Images) and len(result.images) == 2
    assert all(image.shape == (16, 16, 3) and image.dtype == np.uint8 for image in result.images)
    assert not np.array_equal(result.images[0], result.images[1])  # one seed, two draws


async def test_the_same_seed_makes_the_same_pixels(image_engine):
    first, again, other = [(await run(image_engine, picture(seed)))[-1] for seed in (7, 7, 8)]
    assert np.array_equal(first.images[0], again.images[0])
    assert not np.array_equal(first.images[0], other.images[0])


async def test_size_steps_and_guidance_are_the_callers(image_engine):
    chunks = await run(
        image_engine,
        picture(2, width=24, height=32, steps=2, guidance_scale=1.0, negative_prompt="blue"),
    )
    assert [c for c in chunks if isinstance(c, Step)] == [Step(1, 2), Step(2, 2)]
    assert chunks[-1].images[0].shape == (32, 24, 3)


async def test_what_the_pipeline_can_make(image_engine, video_engine):
    info = await image_engine.info()
    assert (info.pipeline, info.default_size, info.size_multiple) == (
        "StableDiffusionPipeline",
        (16, 16),
        8,
    )
    assert info.edits and info.negative_prompt and not info.video
    assert info.size_problem(24, 64) is None
    assert "multiples of 8" in (info.size_problem(20, 16) or "")
    assert "between" in (info.size_problem(16, 72) or "")
    video = await video_engine.info()
    assert (video.pipeline, video.video, video.max_frames, video.fps) == (
        "AnimateDiffPipeline",
        True,
        32,
        8,
    )


async def test_edits_paint_over_a_source_image(image_engine):
    source = np.zeros((16, 16, 3), np.uint8)
    source[:, 8:] = 255
    mask = np.zeros((16, 16), np.uint8)
    mask[:8] = 255
    whole = (await run(image_engine, picture(3, steps=4, image=source)))[-1]
    masked = (await run(image_engine, picture(3, steps=4, image=source, mask=mask)))[-1]
    for result in (whole, masked):
        assert isinstance(result, Images) and result.images[0].shape == (16, 16, 3)
    assert not np.array_equal(whole.images[0], masked.images[0])


async def test_a_video_job_yields_frames(video_engine):
    job = VideoJob(prompt="a cat runs", width=16, height=16, frames=8, steps=2, seed=1)
    chunks = await run(video_engine, job)
    assert chunks[:-1] == [Step(1, 2), Step(2, 2)]
    video = chunks[-1]
    assert isinstance(video, Video) and video.fps == 8
    assert video.frames.shape == (8, 16, 16, 3) and video.frames.dtype == np.uint8


async def test_an_aborted_job_stops_and_the_next_runs(image_engine):
    stream = image_engine.submit("doomed", "s", picture(4, steps=50))
    assert await anext(stream) == Step(1, 50)
    image_engine.abort("doomed")
    with pytest.raises(RequestAborted):
        await anext(stream)
    # The pipeline stops at its next step, so the next job gets the thread.
    chunks = await run(image_engine, picture(5), request_id="next")
    assert isinstance(chunks[-1], Images)


async def test_a_cancelled_step_loop_frees_its_thread():
    """Work that would step forever stops at the step after its reader leaves."""
    thread = StepThread("test-steps")
    stopped = threading.Event()

    def forever(progress: Progress) -> None:
        done = 0
        try:
            while True:
                done += 1
                progress.step(done, 0)
        except Cancelled:
            stopped.set()
            raise

    stream = thread.run(forever)
    assert await anext(stream) == Step(1, 0)
    await stream.aclose()
    assert await asyncio.to_thread(stopped.wait)
    after = [item async for item in thread.run(lambda progress: "next")]
    assert after == ["next"]
    thread.shutdown()


def test_a_directory_without_a_pipeline_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--image-model .*no model_index.json"):
        load_diffusion(str(tmp_path), False)


async def test_a_pipeline_that_does_not_load_says_why(tmp_path):
    (tmp_path / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    engine = load_diffusion(str(tmp_path), False)
    with pytest.raises(PipelineLoadError, match=str(tmp_path)):
        await engine.info()
    assert not engine.ready
    engine.shutdown()


def test_an_image_and_a_video_pipeline_load_together_in_a_fresh_process(tmp_path):
    """``--image-model`` and ``--video-model`` start loading at once on two
    threads; a fresh interpreter is where diffusers is first imported (in
    this one it already is), and where two threads importing it raced."""
    import subprocess
    import sys

    image = tiny_image_pipeline(tmp_path / "image")
    video = tiny_video_pipeline(tmp_path / "video")
    script = (
        "import asyncio\n"
        "from duplex_server.engine.diffusion import load_diffusion\n"
        f"engines = [load_diffusion({str(image)!r}, False), load_diffusion({str(video)!r}, True)]\n"
        "async def main():\n"
        "    for engine in engines:\n"
        "        print((await engine.info()).pipeline)\n"
        "        engine.shutdown()\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )  # the timeout is a hang guard, not a measurement
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["StableDiffusionPipeline", "AnimateDiffPipeline"]
