"""``/v1/videos`` on a real server with a tiny AnimateDiff pipeline built
here (``--video-model``): asynchronous jobs through the stock openai SDK's
``client.videos``, the MP4 read back with PyAV, byte ranges, SSE progress,
the synchronous route."""

from __future__ import annotations

import asyncio
import io
import json

import av
import httpx
import openai
import pytest

from duplex_server.jobs.runner import HOUSEKEEPING_TASK
from tests.batch_helpers import batch_server, client
from tests.tiny_diffusion import tiny_video_pipeline

# 4 s at 2 fps: 8 frames of 16x16, 2 denoising steps.
FAST = {"num_inference_steps": 2, "fps": 2}


@pytest.fixture(scope="module")
def video_model(tmp_path_factory) -> str:
    return str(tiny_video_pipeline(tmp_path_factory.mktemp("tiny-animatediff")))


@pytest.fixture
async def server(video_model, tmp_path):
    async with batch_server(f"sqlite:{tmp_path / 'sessions.db'}", video_model=video_model) as s:
        yield s


def frames_of(mp4: bytes) -> tuple[int, int, int, str]:
    with av.open(io.BytesIO(mp4)) as container:
        stream = container.streams.video[0]
        count = sum(1 for _ in container.decode(stream))
        return count, stream.width, stream.height, stream.codec_context.name


def picture(data: bytes) -> tuple[str, tuple[int, int]]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return str(image.format), image.size


async def finished(sdk: openai.AsyncOpenAI, video_id: str) -> list:
    """The job's states as polled until it ends."""
    seen = []
    while True:
        video = await sdk.videos.retrieve(video_id)
        seen.append(video)
        if video.status in ("completed", "failed"):
            return seen
        await asyncio.sleep(0.1)


async def test_the_sdk_makes_a_video_and_downloads_its_mp4(server):
    sdk = client(server)
    video = await sdk.videos.create(prompt="a cat runs", size="16x16", seconds="4", extra_body=FAST)
    assert (video.object, video.status, video.progress) == ("video", "queued", 0)
    model_name = str(server.config.video_model).rsplit("/", 1)[-1]
    assert (video.seconds, video.size, video.model) == ("4", "16x16", model_name)
    states = await finished(sdk, video.id)
    assert states[-1].status == "completed" and states[-1].progress == 100
    progress = [state.progress for state in states]
    assert progress == sorted(progress) and all(0 <= p <= 100 for p in progress)
    assert states[-1].completed_at is not None and states[-1].expires_at is not None
    content = await sdk.videos.download_content(video.id)
    assert frames_of(content.content) == (8, 16, 16, "h264")
    thumbnail = await sdk.videos.download_content(video.id, variant="thumbnail")
    sheet = await sdk.videos.download_content(video.id, variant="spritesheet")
    assert thumbnail.response.headers["content-type"] == "image/webp"
    assert sheet.response.headers["content-type"] == "image/jpeg"
    assert picture(thumbnail.content) == ("WEBP", (16, 16))
    assert picture(sheet.content) == ("JPEG", (3 * 16, 3 * 16))  # 8 frames, 3 a row
    again = await sdk.videos.download_content(video.id, variant="spritesheet")
    assert again.content == sheet.content  # stored when the video finished
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        bad = await http.get(f"/v1/videos/{video.id}/content", params={"variant": "gif"})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "variant")


async def test_ranges_list_and_delete(server):
    sdk = client(server)
    made = [
        await sdk.videos.create(prompt=f"scene {i}", size="16x16", seconds="4", extra_body=FAST)
        for i in range(3)
    ]
    for video in made:
        await finished(sdk, video.id)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        url = f"/v1/videos/{made[0].id}/content"
        whole = await http.get(url)
        head = await http.get(url, headers={"Range": "bytes=0-99"})
        tail = await http.get(url, headers={"Range": "bytes=100-"})
        beyond = await http.get(url, headers={"Range": f"bytes={len(whole.content)}-"})
    assert whole.headers["accept-ranges"] == "bytes"
    assert whole.headers["content-type"] == "video/mp4"
    assert head.status_code == tail.status_code == 206
    assert head.headers["content-range"] == f"bytes 0-99/{len(whole.content)}"
    assert head.content + tail.content == whole.content
    assert beyond.status_code == 416
    page = await sdk.videos.list(limit=2, order="asc")
    assert [v.id for v in page.data] == [made[0].id, made[1].id] and page.has_more
    rest = await sdk.videos.list(limit=2, order="asc", after=made[1].id)
    assert [v.id for v in rest.data] == [made[2].id]
    deleted = await sdk.videos.delete(made[0].id)
    assert deleted.deleted and deleted.id == made[0].id
    with pytest.raises(openai.NotFoundError):
        await sdk.videos.retrieve(made[0].id)


async def test_the_listing_is_rebuilt_from_the_log_and_reads_only_its_page(video_model, tmp_path):
    store = f"sqlite:{tmp_path / 'listed.db'}"
    async with batch_server(store, video_model=video_model) as first:
        sdk = client(first)
        made = [
            await sdk.videos.create(prompt=f"take {i}", size="16x16", seconds="2", extra_body=FAST)
            for i in range(2)
        ]
        for video in made:
            await finished(sdk, video.id)
    async with batch_server(store, video_model=video_model) as second:
        sdk = client(second)
        listed = await sdk.videos.list(order="asc")
        assert [v.id for v in listed.data] == [v.id for v in made]
        assert {v.status for v in listed.data} == {"completed"}
        log = second.app.state.log
        reads: list[str] = []
        read = log.read

        async def counted(session_id: str, after_seq: int = 0) -> list:
            task = asyncio.current_task()
            if task is None or task.get_name() != HOUSEKEEPING_TASK:  # its sweep reads every job
                reads.append(session_id)
            return await read(session_id, after_seq)

        log.read = counted  # the listing's cost: the page's logs, not every job's
        page = await sdk.videos.list(limit=1)  # newest first
        assert [v.id for v in page.data] == [made[1].id] and page.has_more
        assert reads == [made[1].id]
        rest = await sdk.videos.list(limit=1, after=made[1].id)
        assert [v.id for v in rest.data] == [made[0].id] and not rest.has_more


async def test_progress_streams_as_server_sent_events(server):
    sdk = client(server)
    video = await sdk.videos.create(
        prompt="waves", size="16x16", seconds="4", extra_body={**FAST, "num_inference_steps": 6}
    )
    events = []
    async with (
        httpx.AsyncClient(base_url=server.http_url, timeout=120) as http,
        http.stream(
            "GET", f"/v1/videos/{video.id}", headers={"Accept": "text/event-stream"}
        ) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        name = None
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
    names = [name for name, _ in events]
    assert names[-1] == "video.completed" and set(names[:-1]) <= {"video.progress"}
    progress = [body["progress"] for _, body in events]
    assert progress == sorted(progress) and progress[-1] == 100 and len(set(progress)) >= 3


async def test_the_sync_route_answers_with_the_mp4(server):
    async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as http:
        response = await http.post(
            "/v1/videos/sync",
            json={"prompt": "a dog", "size": "16x16", "seconds": 2, **FAST, "seed": 5},
            headers={"Idempotency-Key": "sync-1"},
        )
        again = await http.post(
            "/v1/videos/sync",
            json={"prompt": "a dog", "size": "16x16", "seconds": 2, **FAST, "seed": 5},
            headers={"Idempotency-Key": "sync-1"},
        )
    assert response.status_code == 200 and response.headers["content-type"] == "video/mp4"
    assert frames_of(response.content) == (4, 16, 16, "h264")
    assert again.content == response.content and again.headers["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"seconds": "12", "fps": 8}, 400, "seconds"),
        ({"size": "20x16"}, 400, "size"),
        ({"size": "720x1280"}, 400, "size"),
        ({"num_inference_steps": 500}, 400, "num_inference_steps"),
        ({"model": "sora-2"}, 404, "model"),
        ({"quality": "high"}, 400, "quality"),
    ],
)
async def test_bad_requests_are_refused_by_name(server, fields, status, param):
    body = {"prompt": "a cat", "size": "16x16", "seconds": "4", **FAST, **fields}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        response = await http.post("/v1/videos", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


async def test_a_reference_image_is_refused_and_a_missing_model_named(server, tmp_path):
    with pytest.raises(openai.BadRequestError) as refused:
        await client(server).videos.create(
            prompt="a cat", input_reference=("ref.png", b"\x89PNG", "image/png"), size="16x16"
        )
    assert refused.value.body["param"] == "input_reference"  # type: ignore[index]
    async with batch_server(f"sqlite:{tmp_path / 'plain.db'}", model="echo") as plain:
        with pytest.raises(openai.NotFoundError) as missing:
            await client(plain).videos.create(prompt="a cat")
    assert missing.value.body["code"] == "model_not_loaded"  # type: ignore[index]
    assert missing.value.body["param"] == "model"  # type: ignore[index]


async def test_deleting_a_video_being_made_stops_it(server):
    sdk = client(server)
    long = await sdk.videos.create(
        prompt="a long one",
        size="16x16",
        seconds="4",
        extra_body={**FAST, "num_inference_steps": 200},
    )
    while (await sdk.videos.retrieve(long.id)).progress == 0:
        await asyncio.sleep(0.05)
    deleted = await sdk.videos.delete(long.id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        await sdk.videos.retrieve(long.id)
    # The pipeline stopped at its next step: the next video gets it at once.
    short = await sdk.videos.create(prompt="next", size="16x16", seconds="4", extra_body=FAST)
    states = await finished(sdk, short.id)
    assert states[-1].status == "completed"
    assert server.app.state.batch.videos.engine.core.completed == 1  # only the short one
