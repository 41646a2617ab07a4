"""``/v1/videos``: text-to-video as asynchronous jobs, the way OpenAI's and
vLLM-Omni's video APIs run them, on a diffusers pipeline (``--video-model``).

``POST /v1/videos`` answers at once with the job (``queued``); the job runs
in the job runner (a one-shot session on the log: it survives a restart,
an ``Idempotency-Key`` retry finds it) and reports its denoising progress
as ``progress`` records. ``GET /v1/videos/{id}`` reads the job back from
its records (as SSE events while it runs, to a client that asks for
``text/event-stream``); the finished video is an MP4 (H.264 through PyAV)
in the blob store, served whole or by HTTP range (a player seeks without
downloading everything). ``POST /v1/videos/sync`` answers with the MP4."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from batch_api.http import (
    answer,
    decode_struct,
    error_response,
    idempotency_key,
    principal_name,
    unsupported,
)
from batch_api.images import MAX_PROMPT_CHARS, MAX_STEPS, job_seed
from batch_api.video_media import VARIANTS, encode_mp4, previews
from duplex_server.config import ServerConfig
from duplex_server.engine.diffusion import (
    DiffusionEngine,
    PipelineInfo,
    PipelineLoadError,
    Step,
    Video,
    VideoJob,
    load_diffusion,
)
from duplex_server.http_body import BodyTooLarge, limited_stream, read_limited
from duplex_server.http_errors import refusal
from duplex_server.jobs.blobs import stream_file
from duplex_server.jobs.journal import StoredJob
from duplex_server.jobs.run import JobError, JobInput, JobKind, JobRequest
from duplex_server.jobs.runner import JobRunner
from duplex_server.sessions.core import records as r
from duplex_server.sessions.log.store import UnknownSession

ROUTE = "/v1/videos"
ROUTE_SYNC = "/v1/videos/sync"
MP4 = VARIANTS["video"]
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
DEFAULT_SECONDS = 4
DEFAULT_STEPS = 25
MAX_LIST = 100
MAX_FORM_FIELDS = 16
MAX_FIELD_BYTES = 64 * 1024  # a form field that is not a file (a prompt)
MAX_JSON_BODY_BYTES = 1024 * 1024
POLL_S = 0.25  # an SSE stream re-reads its job's records this often
ENCODING_SHARE = 5  # percent of progress left for writing the MP4


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


class VideoRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    prompt: str
    model: str | None = None
    seconds: str | int = DEFAULT_SECONDS
    size: str = "auto"
    seed: int | None = None
    num_inference_steps: int | None = None
    # vLLM-Omni's fields
    negative_prompt: str | None = None
    guidance_scale: float | None = None
    fps: int | None = None
    num_frames: int | None = None


# OpenAI's video parameters this server refuses whenever they are sent, and why.
REFUSED = {"input_reference": "this text-to-video pipeline takes no reference image"}


class VideoError(msgspec.Struct):
    code: str
    message: str


class VideoObject(msgspec.Struct, omit_defaults=False):
    """OpenAI's ``video`` object."""

    id: str
    created_at: int
    model: str
    progress: int
    seconds: str
    size: str
    status: str
    prompt: str
    object: str = "video"
    completed_at: int | None = None
    expires_at: int | None = None
    error: VideoError | None = None
    remixed_from_video_id: str | None = None


def _invalid(param: str, message: str, code: str = "invalid_value") -> JobError:
    return JobError(400, code, message, param)


@dataclass(frozen=True)
class Plan:
    """A request resolved against the pipeline: what the job will make."""

    width: int
    height: int
    frames: int
    fps: int


def plan(req: VideoRequest, info: PipelineInfo) -> Plan:
    """What ``req`` asks of ``info``'s pipeline, or the 4xx naming the field."""
    from batch_api.images import parse_size

    if req.model is not None and req.model != info.name:
        raise JobError(
            404, "model_not_found", f"model {req.model!r} is not served; {info.name!r} is", "model"
        )
    if not req.prompt.strip() or len(req.prompt) > MAX_PROMPT_CHARS:
        raise _invalid("prompt", f"prompt must be 1 to {MAX_PROMPT_CHARS} characters")
    seconds = str(req.seconds)
    if not seconds.isdigit() or int(seconds) < 1:
        raise _invalid("seconds", f"seconds {req.seconds!r} is not a whole number of seconds")
    fps = req.fps if req.fps is not None else info.fps
    if not 1 <= fps <= 60:
        raise _invalid("fps", "fps must be 1 to 60")
    frames = req.num_frames if req.num_frames is not None else int(seconds) * fps
    if not 1 <= frames <= info.max_frames:
        param = "num_frames" if req.num_frames is not None else "seconds"
        raise _invalid(
            param,
            f"{info.name} makes at most {info.max_frames} frames "
            f"({info.max_frames // fps} s at {fps} fps); {frames} asked",
        )
    if req.num_inference_steps is not None and not 1 <= req.num_inference_steps <= MAX_STEPS:
        raise _invalid("num_inference_steps", f"num_inference_steps must be 1 to {MAX_STEPS}")
    if req.negative_prompt is not None and not info.negative_prompt:
        raise _invalid(
            "negative_prompt", f"{info.pipeline} takes no negative prompt", "unsupported_value"
        )
    if req.seed is not None and not 0 <= req.seed < 2**63:
        raise _invalid("seed", "seed must be 0 to 2**63 - 1")
    width, height = parse_size(req.size, info)
    return Plan(width, height, frames, fps)


@dataclass
class VideosApi:
    """The video routes and their job kinds over one loaded pipeline (None:
    no ``--video-model``, and the routes say so)."""

    engine: DiffusionEngine | None
    runner: JobRunner
    max_upload_bytes: int
    retention_s: float

    @classmethod
    def build(cls, config: ServerConfig, runner: JobRunner) -> VideosApi:
        """Starts loading ``--video-model`` (on the engine's thread) and
        registers the job kinds, so jobs a crash left can run again."""
        engine = load_diffusion(config.video_model, video=True) if config.video_model else None
        api = cls(engine, runner, config.max_upload_bytes, config.batch_retention_s)
        runner.register(JobKind(ROUTE, api._produce, lambda _: MP4, listed=True))
        runner.register(JobKind(ROUTE_SYNC, api._produce, lambda _: MP4))
        return api

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()

    @property
    def routes(self) -> list[Route]:
        return [
            Route(ROUTE, self.create, methods=["POST"]),
            Route(ROUTE, self.list_videos, methods=["GET"]),
            Route(ROUTE_SYNC, self.create_sync, methods=["POST"]),
            Route(ROUTE + "/{video_id}", self.retrieve, methods=["GET"]),
            Route(ROUTE + "/{video_id}", self.delete, methods=["DELETE"]),
            Route(ROUTE + "/{video_id}/content", self.content, methods=["GET"]),
        ]

    async def _info(self) -> PipelineInfo:
        if self.engine is None:
            raise JobError(
                404,
                "model_not_loaded",
                "no video model is loaded: serve --video-model PATH (a diffusers pipeline)",
                "model",
            )
        try:
            return await self.engine.info()
        except PipelineLoadError as exc:
            raise JobError(503, "model_not_loaded", str(exc), "model") from exc

    # --- submitting -------------------------------------------------------------

    async def _submit(self, request: Request, route: str) -> tuple[str, VideoRequest, str]:
        principal = principal_name(request)
        info = await self._info()
        req = await self._read(request)
        resolved = plan(req, info)
        if req.size == "auto":
            req = msgspec.structs.replace(req, size=f"{resolved.width}x{resolved.height}")
        if req.model is None:
            req = msgspec.structs.replace(req, model=info.name)
        run = await self.runner.submit(
            JobRequest(route, principal, msgspec.json.encode(req), idempotency_key(request))
        )
        return run.job_id, req, principal

    async def create(self, request: Request) -> Response:
        try:
            job_id, _, principal = await self._submit(request, ROUTE)
            video = await self._video(job_id, principal)
        except JobError as exc:
            return error_response(exc)
        return _json(video)

    async def create_sync(self, request: Request) -> Response:
        try:
            principal = principal_name(request)
            info = await self._info()
            req = await self._read(request)
            plan(req, info)
            run = await self.runner.submit(
                JobRequest(
                    ROUTE_SYNC, principal, msgspec.json.encode(req), idempotency_key(request)
                )
            )
        except JobError as exc:
            return error_response(exc)
        return await answer(run)

    async def _read(self, request: Request) -> VideoRequest:
        """JSON, or multipart as the openai SDK sends it (``input_reference``
        is a file: refused, the text-to-video pipeline takes none)."""
        media = request.headers.get("content-type", "")
        if not media.startswith("multipart/form-data"):
            try:
                body = await read_limited(request, MAX_JSON_BODY_BYTES)
            except BodyTooLarge:
                raise JobError(413, "payload_too_large", "the JSON body is too large") from None
            return decode_struct(body, VideoRequest, REFUSED)
        parser = MultiPartParser(
            request.headers,
            limited_stream(request, self.max_upload_bytes),
            max_files=1,
            max_fields=MAX_FORM_FIELDS,
            max_part_size=MAX_FIELD_BYTES,
        )
        try:
            form = await parser.parse()
        except BodyTooLarge:
            raise JobError(
                413, "payload_too_large", f"the upload is over {self.max_upload_bytes} bytes"
            ) from None
        except MultiPartException as exc:
            raise JobError(400, "invalid_request_body", exc.message) from None
        fields: dict[str, object] = {}
        try:
            for name, value in form.multi_items():
                if name in REFUSED:
                    raise unsupported(name, REFUSED[name])
                if isinstance(value, UploadFile):
                    raise JobError(
                        400, "unknown_parameter", f"unrecognized request argument: {name}", name
                    )
                number = name in ("seed", "num_inference_steps", "fps", "num_frames")
                fields[name] = int(value) if number and value.lstrip("-").isdigit() else value
                if name == "guidance_scale":
                    fields[name] = _float_or_text(value)
        finally:
            await form.close()
        return decode_struct(msgspec.json.encode(fields), VideoRequest, REFUSED)

    # --- running ---------------------------------------------------------------

    async def _produce(self, given: JobInput) -> AsyncIterator[bytes]:
        req = msgspec.json.decode(given.params, type=VideoRequest)
        info = await self._info()  # again: the server may have restarted with another model
        resolved = plan(req, info)
        job = VideoJob(
            prompt=req.prompt,
            width=resolved.width,
            height=resolved.height,
            frames=resolved.frames,
            steps=req.num_inference_steps or DEFAULT_STEPS,
            seed=req.seed if req.seed is not None else job_seed(given.job_id),
            negative_prompt=req.negative_prompt,
            guidance_scale=req.guidance_scale,
        )
        assert self.engine is not None  # _info() refuses without one
        video: Video | None = None
        await given.progress(0, "queued")
        async for chunk in self.engine.submit(given.job_id, given.job_id, job):
            if isinstance(chunk, Step):
                share = 100 - ENCODING_SHARE
                await given.progress(chunk.done * share // max(1, chunk.total), "denoising")
            elif isinstance(chunk, Video):
                video = chunk
        assert video is not None  # the engine ends every job with its result
        await given.progress(100 - ENCODING_SHARE, "encoding")
        data = await given.offload(encode_mp4, Video(video.frames, resolved.fps))
        given.assets.update(await given.offload(previews, data))
        given.metadata.update(seed=job.seed, frames=job.frames, fps=resolved.fps)
        yield data

    # --- reading back ------------------------------------------------------------

    async def _stored(self, video_id: str, principal: str) -> StoredJob:
        """The job behind ``video_id`` (one read of its log) if it is this
        principal's video; 404 otherwise."""
        stored = await self.runner.job(principal, video_id)
        if stored is None or stored.job is None or stored.job.route != ROUTE:
            raise JobError(404, "video_not_found", f"no video {video_id!r}", "video_id")
        return stored

    async def _video(self, video_id: str, principal: str) -> VideoObject:
        return self._object(await self._stored(video_id, principal))

    def _object(self, stored: StoredJob) -> VideoObject:
        assert stored.job is not None
        req = msgspec.json.decode(stored.job.params, type=VideoRequest)
        result, finished_ms = stored.result, stored.finished_ms
        video = VideoObject(
            id=stored.job_id,
            created_at=stored.created_ms // 1000,
            model=req.model or "",
            progress=stored.progress,
            seconds=str(req.seconds),
            size=req.size,
            status="queued" if stored.progress == 0 else "in_progress",
            prompt=req.prompt,
        )
        if result is None or finished_ms is None:
            return video
        video.completed_at = finished_ms // 1000
        video.expires_at = (finished_ms + int(self.retention_s * 1000)) // 1000
        if result.status == "completed":
            video.status, video.progress = "completed", 100
        else:
            video.status = "failed"
            video.error = VideoError(result.error_code or "failed", result.error_message or "")
        return video

    async def retrieve(self, request: Request) -> Response:
        try:
            principal = principal_name(request)
            video_id = request.path_params["video_id"]
            video = await self._video(video_id, principal)
        except JobError as exc:
            return error_response(exc)
        if "text/event-stream" in request.headers.get("accept", ""):
            return StreamingResponse(
                self._events(video_id, principal, video), media_type="text/event-stream"
            )
        return _json(video)

    async def _events(
        self, video_id: str, principal: str, video: VideoObject
    ) -> AsyncIterator[bytes]:
        """``video.progress`` for every step the job's log records, then
        ``video.completed`` or ``video.failed``; the stream ends with the job
        (or its deletion). The events come from the log's ``progress``
        records, not from samples of the job's state, so a client that
        connects late, or reads slowly, still sees every step once."""
        after, shown = 0, -1
        while True:
            try:
                records = await self.runner.log.read(video_id, after_seq=after)
            except UnknownSession:
                return
            for record in records:
                after = record.seq
                body = record.body
                if isinstance(body, r.ProgressBody) and body.percent > shown:
                    shown = body.percent
                    video.progress = body.percent
                    video.status = "queued" if body.percent == 0 else "in_progress"
                    yield _sse("video.progress", msgspec.json.encode(video))
                elif isinstance(body, r.ResultBody):
                    try:
                        final = await self._video(video_id, principal)
                    except JobError:
                        return
                    yield _sse(f"video.{final.status}", msgspec.json.encode(final))
                    return
            await asyncio.sleep(POLL_S)

    async def list_videos(self, request: Request) -> Response:
        try:
            principal = principal_name(request)
            limit = _int_param(request, "limit", 20)
            if not 1 <= limit <= MAX_LIST:
                raise _invalid("limit", f"limit must be 1 to {MAX_LIST}")
            order = request.query_params.get("order", "desc")
            if order not in ("asc", "desc"):
                raise _invalid("order", "order is asc or desc")
            after = request.query_params.get("after")
            found = await self.runner.listing(principal, ROUTE, after, limit, order == "desc")
            page = await self._page(found.job_ids, principal)
        except JobError as exc:
            return error_response(exc)
        body = {
            "object": "list",
            "data": [msgspec.to_builtins(v) for v in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": found.has_more,
        }
        return JSONResponse(body)

    async def _page(self, video_ids: list[str], principal: str) -> list[VideoObject]:
        """The listed videos, each read from its log (a page's worth, never
        all of them); one deleted meanwhile is left out, and out of the index."""
        videos = []
        for video_id in video_ids:
            try:
                videos.append(await self._video(video_id, principal))
            except JobError as exc:
                if exc.status != 404:
                    raise
                self.runner.unlisted(video_id)
        return videos

    async def delete(self, request: Request) -> Response:
        """Deletes the video; one still being made is stopped first (its
        diffusion job aborts at its next step)."""
        try:
            principal = principal_name(request)
            video_id = request.path_params["video_id"]
            await self._stored(video_id, principal)
            if self.engine is not None:
                self.engine.abort(video_id)
            if not await self.runner.delete(principal, video_id):
                raise JobError(404, "video_not_found", f"no video {video_id!r}", "video_id")
        except JobError as exc:
            return error_response(exc)
        return JSONResponse({"id": video_id, "object": "video.deleted", "deleted": True})

    async def content(self, request: Request) -> Response:
        """The MP4 (``variant=video``, the default), its ``thumbnail`` or its
        ``spritesheet``: blobs the job stored when it finished; any of them
        by byte range."""
        try:
            principal = principal_name(request)
            variant = request.query_params.get("variant", "video")
            if variant not in VARIANTS:
                raise _invalid("variant", f"variant {variant!r}: one of {', '.join(VARIANTS)}")
            stored = await self._stored(request.path_params["video_id"], principal)
            if stored.result is None or stored.result.output is None:
                raise JobError(409, "video_not_ready", "the video has not finished", "video_id")
            if variant == "video":
                path = await self.runner.output_path(stored)
            else:
                path = await self.runner.asset_path(stored, variant)
        except JobError as exc:
            return error_response(exc)
        return _ranged(path, VARIANTS[variant], request.headers.get("range"))


def _ranged(path: Path, media_type: str, range_header: str | None) -> Response:
    """The file whole (200) or the one byte range asked for (206; 416 if it
    names no byte), streamed from disk a chunk at a time: memory does not
    grow with the file."""
    size = path.stat().st_size
    try:
        span = byte_range(range_header, size)
    except RangeNotSatisfiable:
        refused = refusal(416, "range_not_satisfiable", f"the range names no byte of {size}")
        refused.headers["Content-Range"] = f"bytes */{size}"
        return refused
    first, last = span if span is not None else (0, size - 1)
    headers = {"Accept-Ranges": "bytes", "Content-Length": str(last + 1 - first)}
    status = 200
    if span is not None:
        status = 206
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    body = stream_file(path, first, last + 1 - first)
    return StreamingResponse(body, status, headers=headers, media_type=media_type)


def _json(video: VideoObject) -> Response:
    return Response(msgspec.json.encode(video), media_type="application/json")


def _sse(event: str, data: bytes) -> bytes:
    return f"event: {event}\ndata: ".encode() + data + b"\n\n"


def _int_param(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name)
    if value is None:
        return default
    if not value.isdigit():
        raise _invalid(name, f"{name} must be a whole number")
    return int(value)


def _float_or_text(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value
