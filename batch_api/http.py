"""What every batch route does the same way: who is calling, reading a
bounded body, the ``Idempotency-Key``, OpenAI-style errors, and answering
from a job's run.

Routes built on this (speech, transcriptions, images, videos) validate
their request into a msgspec Struct, hand it to the :class:`JobRunner` as a
:class:`JobRequest` and answer with :func:`answer` (a whole body) or stream
``run.stream()`` themselves.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from duplex_server.auth import caller, denial
from duplex_server.http_body import BodyTooLarge, read_limited
from duplex_server.http_errors import refusal
from duplex_server.jobs.run import JobError, JobRun

MAX_JSON_BODY_BYTES = 1024 * 1024  # a JSON request body (speech input is 4,096 characters)
IDEMPOTENCY_HEADER = "Idempotency-Key"
JOB_ID_HEADER = "x-duplex-job-id"  # the job session's id: GET /v1/sessions/{id}/events
REPLAYED_HEADER = "Idempotent-Replayed"  # "true": answered from the log, nothing ran

S = TypeVar("S", bound=msgspec.Struct)


def error_response(exc: JobError) -> Response:
    """OpenAI's error envelope: ``{"error": {message, type, param, code}}``."""
    return refusal(exc.status, exc.code, exc.message, param=exc.param)


def principal_name(request: Request) -> str:
    """The calling principal (API key name) if it may use the batch routes."""
    principal = caller(request)
    refused = denial(principal, "batch")
    if refused is not None:
        status, err = refused
        raise JobError(status, err.code, err.message)
    assert principal is not None
    return principal.name


def idempotency_key(request: Request) -> str | None:
    return request.headers.get(IDEMPOTENCY_HEADER)


async def read_json(
    request: Request, struct: type[S], refused: Mapping[str, str] | None = None
) -> S:
    """The JSON body as ``struct``; 400 naming the field for a wrong one
    (``refused``: see :func:`decode_struct`)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media not in ("application/json", ""):
        raise JobError(400, "invalid_request_body", f"send JSON, not {media}")
    try:
        body = await read_limited(request, MAX_JSON_BODY_BYTES)
    except BodyTooLarge:
        raise JobError(
            413, "payload_too_large", f"the JSON body is over {MAX_JSON_BODY_BYTES} bytes"
        ) from None
    return decode_struct(body, struct, refused)


def decode_struct(body: bytes, struct: type[S], refused: Mapping[str, str] | None = None) -> S:
    """``refused``: parameters OpenAI defines that this route cannot honour,
    each with why. One of those is ``unsupported_value`` naming it, never
    ``unknown_parameter``: that code is for a name OpenAI does not define."""
    try:
        return msgspec.json.decode(body, type=struct)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc), refused or {}) from None
    except msgspec.DecodeError as exc:
        raise JobError(400, "invalid_json", f"the body is not JSON ({exc})") from None


def unsupported(param: str, why: str) -> JobError:
    """A parameter OpenAI defines, refused here, and why."""
    return JobError(400, "unsupported_value", f"{param} is not supported here: {why}", param)


def form_name(name: str) -> str:
    """A multipart field's parameter: the openai SDK sends a list as
    ``include[]`` and an object as ``chunking_strategy[type]``."""
    return name.split("[", 1)[0]


def _validation_error(text: str, refused: Mapping[str, str]) -> JobError:
    """msgspec says ``... - at `$.field` `` or ``Object contains unknown field `x` ``."""
    if text.startswith("Object contains unknown field"):
        field = text.split("`")[1]
        if field in refused:
            return unsupported(field, refused[field])
        return JobError(400, "unknown_parameter", f"unrecognized request argument: {field}", field)
    if text.startswith("Object missing required field"):
        field = text.split("`")[1]
        return JobError(
            400, "missing_required_parameter", f"missing required parameter: {field}", field
        )
    param = None
    if "at `$." in text:
        param = text.rsplit("at `$.", 1)[1].rstrip("`").split("[")[0].split(".")[0]
    return JobError(400, "invalid_type", text, param)


def job_headers(run: JobRun) -> dict[str, str]:
    headers = {JOB_ID_HEADER: run.job_id}
    if run.outcome is not None and run.outcome.replayed:
        headers[REPLAYED_HEADER] = "true"
    return headers


async def answer(run: JobRun) -> Response:
    """The whole body once the job has finished, or its error."""
    outcome = await run.wait()
    if outcome.error is not None:
        response = error_response(outcome.error)
        response.headers.update(job_headers(run))
        return response
    return Response(outcome.body, media_type=outcome.content_type, headers=job_headers(run))


class StreamBroken(Exception):
    """A streamed job failed after its first bytes went out: the response
    is cut off (no end of the chunked body), so the client sees it incomplete."""


async def streamed(run: JobRun, sse: bool) -> AsyncIterator[bytes]:
    """The run's body as it is made. A job that fails once the 200 has gone
    out ends an SSE stream with an ``error`` event (OpenAI's error fields),
    and cuts any other body off."""
    async for chunk in run.stream():
        yield chunk
    error = run.outcome.error if run.outcome is not None else None
    if error is None:
        return
    if sse:
        fields = {"message": error.message, "code": error.code, "param": error.param}
        yield b"data: " + json.dumps({"type": "error", "error": fields}).encode() + b"\n\n"
        return
    raise StreamBroken(f"job {run.job_id} failed mid-stream: {error.code}: {error.message}")
