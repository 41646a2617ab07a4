"""Where an image job's time goes inside the server, against the same
pipeline called directly in the same process.

``python scripts/image_route_breakdown.py PIPELINE_DIR [JOBS]`` serves the
app in this process (uvicorn on a thread, memory store) with
``--image-model PIPELINE_DIR``, posts JOBS 4-step 128x128 jobs one after
another, and after each calls the server's own loaded pipeline class
directly (``bench.diffusion_pipeline.DirectPipeline``). It prints medians in
ms: the direct call, the client's whole request, request arrival -> the
pipeline's start, the pipeline, its end -> the response's last byte sent,
and the client's own share. ``bench batch`` compares the route against a
direct call in another process; this one separates the route's own cost
from how fast two processes happen to run the same pipeline.
Build a pipeline with ``duplex_bench.diffusion_pipeline.build``."""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duplex_server.engine.diffusion.pipeline as served  # noqa: E402
from duplex_bench.batch_images import ImageAsk  # noqa: E402
from duplex_bench.diffusion_pipeline import DirectPipeline  # noqa: E402
from duplex_server.app import create_app  # noqa: E402
from duplex_server.config import ServerConfig  # noqa: E402

PORT = 8792
ROUTE = "/v1/images/generations"
marks: dict[str, list[float]] = {}


def mark(name: str) -> None:
    marks.setdefault(name, []).append(time.perf_counter())


def timed_pipeline() -> None:
    images = served.LoadedPipeline.images

    def wrapped(self: Any, job: Any, progress: Any) -> Any:
        mark("start")
        result = images(self, job, progress)
        mark("end")
        return result

    served.LoadedPipeline.images = wrapped  # type: ignore[method-assign]


def timed_route(app: Any) -> Any:
    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != ROUTE:
            return await app(scope, receive, send)
        mark("received")

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                mark("sent")
            await send(message)

        return await app(scope, receive, sending)

    return asgi


def main() -> None:
    path, jobs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    timed_pipeline()
    config = ServerConfig(store="memory", model="cascade", asr="pocketsphinx", image_model=path)
    server = uvicorn.Server(uvicorn.Config(timed_route(create_app(config)), port=PORT))
    threading.Thread(target=server.run, daemon=True).start()
    client_s: list[float] = []
    direct_s: list[float] = []
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=600) as http:
        while True:
            try:
                if http.get("/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)

        def post(seed: int) -> float:
            began = time.perf_counter()
            body = {"prompt": "a lighthouse", "size": "128x128", "seed": seed}
            http.post(ROUTE, json={**body, "num_inference_steps": 4}).raise_for_status()
            return time.perf_counter() - began

        client_s.append(post(0))  # warms the route; waits for the pipeline's load
        direct = DirectPipeline(path)  # after it: diffusers' lazy imports race across threads
        for job in range(jobs + 1):  # the first direct call warms that side
            client_s.append(post(job + 1))
            direct_s.append(direct.paint(ImageAsk("a lighthouse", 128, 128, 4, 1, job))[0])
    server.should_exit = True

    def ms(values: list[float]) -> float:  # the first of each side warmed it
        return round(statistics.median(values[1:]) * 1000, 2)

    def spans(first: str, last: str) -> list[float]:
        return [b - a for a, b in zip(marks[first], marks[last], strict=True)]

    route = spans("received", "sent")
    print(f"direct call {ms(direct_s)}")
    print(f"client request {ms(client_s)}")
    print(f"received -> pipeline start {ms(spans('received', 'start'))}")
    print(f"pipeline {ms(spans('start', 'end'))}")
    print(f"pipeline end -> sent {ms(spans('end', 'sent'))}")
    print(f"client's own {ms([c - r for c, r in zip(client_s, route, strict=True)])}")


if __name__ == "__main__":
    main()
