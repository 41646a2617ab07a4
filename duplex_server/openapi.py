"""``GET /openapi.json``: the REST routes as an OpenAPI 3.1 document.

Request bodies are the msgspec Structs that validate them
(``msgspec.json.schema_components``), never a copy of their fields: a field
added to a Struct appears here with it. A multipart body is its Struct's
fields, less those the route fills itself (a transcription's ``filename``),
plus its file parts and the few form-only fields its route reads without a
Struct. Every refusal is OpenAI's error envelope (``http_errors``). The
table below names each route once; a test checks it against the app's
routes, so a new route without an entry fails.

Not here: the WebSocket routes (``/v1/realtime``, ``/v1/duplex``, the
speech stream, Twilio's media stream; PROTOCOL.md is their contract), the
browser page and its static files, and Twilio's voice webhook (its caller
and its contract are Twilio's).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from batch_api import images, speech, transcriptions, videos
from duplex_server import __version__
from duplex_server.client_secrets import ClientSecretRequest
from duplex_server.webrtc.offer import RESUME_FIELDS
from duplex_server.webrtc.routes import CALLS_PATH
from protocol.client_events import SessionResume
from protocol.errors import ErrorBody
from protocol.session_config import SessionUpdate

Schema = dict[str, Any]
REF = "#/components/schemas/{name}"
BINARY: Schema = {"type": "string", "format": "binary"}
TEXT: Schema = {"type": "string"}
ANY_JSON: Schema = {"type": "object"}


class ErrorResponse(msgspec.Struct):
    """OpenAI's error envelope: what every refusal's body is."""

    error: ErrorBody


@dataclass(frozen=True)
class Body:
    """A request body: ``struct``'s fields as JSON, or as multipart form
    fields (less ``drop``; or the whole Struct as the one JSON ``part``)
    beside the ``files`` and the ``form_only`` fields the route reads
    without the Struct (each with whether it is required)."""

    struct: type[msgspec.Struct]
    media: Literal["json", "multipart", "json+multipart"] = "json"
    files: tuple[tuple[str, bool], ...] = ()
    drop: tuple[str, ...] = ()
    form_only: tuple[tuple[str, Schema, bool], ...] = ()
    part: str | None = None
    required: bool = True


@dataclass(frozen=True)
class Param:
    name: str
    where: Literal["path", "query", "header"]
    schema: Schema = field(default_factory=lambda: dict(TEXT))
    required: bool = False


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    ok: dict[str, dict[str, Schema]]  # status -> media type -> schema
    body: Body | None = None
    params: tuple[Param, ...] = ()
    raw_body: dict[str, Schema] | None = None  # media types beside ``body``'s (an SDP)


def _struct_params(struct: type[msgspec.Struct], names: tuple[str, ...]) -> tuple[Param, ...]:
    """Query parameters typed by the Struct that holds them."""
    (_,), components = msgspec.json.schema_components([struct], ref_template=REF)
    properties = components[struct.__name__]["properties"]
    return tuple(Param(name, "query", properties[name]) for name in names)


IDEMPOTENCY = Param("Idempotency-Key", "header")
JOB_POST = (IDEMPOTENCY,)
SESSION_ID = Param("session_id", "path", required=True)
VIDEO_ID = Param("video_id", "path", required=True)
VIDEO: dict[str, dict[str, Schema]] = {"200": {"application/json": {"$ref": "VideoObject"}}}
JSON_OK: dict[str, dict[str, Schema]] = {"200": {"application/json": ANY_JSON}}

OPERATIONS: tuple[Operation, ...] = (
    Operation("get", "/health", "Liveness (details for an admin key)", JSON_OK),
    Operation(
        "get",
        "/ready",
        "Readiness: 503 with the reasons while no session can open",
        {**JSON_OK, "503": {"application/json": ANY_JSON}},
    ),
    Operation("get", "/version", "The server's version", JSON_OK),
    Operation("get", "/metrics", "Prometheus metrics (admin)", {"200": {"text/plain": {}}}),
    Operation("get", "/openapi.json", "This document", JSON_OK),
    Operation("get", "/v1/models", "The served model under each name", JSON_OK),
    Operation(
        "get", "/v1/sessions/{session_id}", "A session's object", JSON_OK, None, (SESSION_ID,)
    ),
    Operation(
        "get",
        "/v1/sessions/{session_id}/events",
        "A session's log as JSON lines",
        {"200": {"application/x-ndjson": {}}},
        None,
        (SESSION_ID, Param("after", "query", {"type": "integer", "minimum": 0})),
    ),
    Operation(
        "post",
        "/v1/realtime/client_secrets",
        "A short-lived key for a browser",
        JSON_OK,
        Body(ClientSecretRequest, required=False),
    ),
    Operation(
        "post",
        CALLS_PATH,
        "A WebRTC call: the SDP offer in, the answer out",
        {"201": {"application/sdp": TEXT}},
        Body(SessionUpdate, "multipart", form_only=(("sdp", TEXT, True),), part="session"),
        (
            Param("model", "query"),
            Param("events", "query"),  # the event spellings (PROTOCOL.md)
            *_struct_params(SessionResume, RESUME_FIELDS),
        ),
        raw_body={"application/sdp": TEXT},
    ),
    Operation(
        "post",
        CALLS_PATH + "/{call_id}/hangup",
        "End a call",
        JSON_OK,
        None,
        (Param("call_id", "path", required=True),),
    ),
    Operation(
        "post",
        speech.ROUTE,
        "Text to speech",
        {"200": {"audio/*": BINARY, "text/event-stream": {}}},
        Body(speech.SpeechRequest),
        JOB_POST,
    ),
    Operation(
        "post",
        transcriptions.ROUTE,
        "Speech to text",
        {"200": {"application/json": ANY_JSON, "text/plain": {}, "text/event-stream": {}}},
        Body(
            transcriptions.TranscriptionRequest,
            "multipart",
            files=(("file", True),),
            drop=("filename",),
            form_only=(
                ("temperature", {"type": "number"}, False),
                ("chunking_strategy", TEXT, False),
            ),
        ),
        JOB_POST,
    ),
    Operation(
        "post",
        images.ROUTE_GENERATIONS,
        "Pictures from a prompt",
        JSON_OK,
        Body(images.ImageRequest),
        JOB_POST,
    ),
    Operation(
        "post",
        images.ROUTE_EDITS,
        "A picture edited by a prompt",
        JSON_OK,
        Body(images.ImageRequest, "multipart", files=(("image", True), ("mask", False))),
        JOB_POST,
    ),
    Operation(
        "post",
        videos.ROUTE,
        "Start a video job",
        VIDEO,
        Body(videos.VideoRequest, "json+multipart"),
        JOB_POST,
    ),
    Operation(
        "get",
        videos.ROUTE,
        "The caller's videos, a page at a time",
        JSON_OK,
        None,
        (
            Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": videos.MAX_LIST}),
            Param("order", "query", {"enum": ["asc", "desc"]}),
            Param("after", "query"),
        ),
    ),
    Operation(
        "post",
        videos.ROUTE_SYNC,
        "Make a video and answer with the MP4",
        {"200": {"video/mp4": BINARY}},
        Body(videos.VideoRequest, "json+multipart"),
        JOB_POST,
    ),
    Operation(
        "get",
        videos.ROUTE + "/{video_id}",
        "A video job (Server-Sent Events for Accept: text/event-stream)",
        {"200": {"application/json": {"$ref": "VideoObject"}, "text/event-stream": {}}},
        None,
        (VIDEO_ID,),
    ),
    Operation("delete", videos.ROUTE + "/{video_id}", "Delete a video", JSON_OK, None, (VIDEO_ID,)),
    Operation(
        "get",
        videos.ROUTE + "/{video_id}/content",
        "The MP4, its thumbnail or spritesheet, whole or by byte range",
        {"200": {"*/*": BINARY}, "206": {"*/*": BINARY}},
        None,
        (
            VIDEO_ID,
            Param("variant", "query", {"enum": list(videos.VARIANTS)}),
            Param("Range", "header"),
        ),
    ),
)


def _ref(schema: Schema) -> Schema:
    """A bare ``{"$ref": "Name"}`` in the table, as a component reference."""
    ref = schema.get("$ref")
    if ref is not None and not ref.startswith("#"):
        return {"$ref": REF.format(name=ref)}
    return schema


def _schema_hook(t: type) -> Schema:
    if t is object:  # an open value (a tool's JSON Schema ``parameters``): any JSON
        return {"description": "any JSON value"}
    raise NotImplementedError


def _never_null(schema: Schema) -> Schema:
    """A form field is text or absent, never null: ``T | None`` becomes ``T``."""
    choices = [s for s in schema.get("anyOf", ()) if s != {"type": "null"}]
    if len(choices) != 1:
        return schema
    rest = {k: v for k, v in schema.items() if k != "anyOf" and (k, v) != ("default", None)}
    return {**choices[0], **rest}


def _form(name: str, body: Body, components: dict[str, Schema]) -> Schema:
    """The Struct's component as a multipart form: its fields less ``drop``
    (or the Struct as one JSON part), with the file parts and form-only
    fields added."""
    if body.part is not None:
        ref = {"$ref": REF.format(name=body.struct.__name__)}
        form: Schema = {"type": "object", "properties": {body.part: ref}, "required": []}
        form["additionalProperties"] = False
    else:
        form = copy.deepcopy(components[body.struct.__name__])
    properties = form.setdefault("properties", {})
    for dropped in body.drop:
        properties.pop(dropped, None)
    for key, schema in properties.items():
        properties[key] = _never_null(schema)
    required = [f for f in form.get("required", []) if f not in body.drop]
    for extra, schema, needed in body.form_only:
        properties.setdefault(extra, dict(schema))
        required += [extra] if needed else []
    for file, needed in body.files:
        properties[file] = BINARY
        required += [file] if needed else []
    form["required"] = required
    form["title"] = name
    return form


def _request_body(op: Operation, components: dict[str, Schema]) -> Schema:
    content: dict[str, Schema] = {}
    body = op.body
    assert body is not None
    ref = {"$ref": REF.format(name=body.struct.__name__)}
    if "json" in body.media:
        content["application/json"] = {"schema": ref}
    if "multipart" in body.media:
        name = body.struct.__name__ + "Form"
        components[name] = _form(name, body, components)
        form: Schema = {"schema": {"$ref": REF.format(name=name)}}
        if body.part is not None:
            form["encoding"] = {body.part: {"contentType": "application/json"}}
        content["multipart/form-data"] = form
    for media, schema in (op.raw_body or {}).items():
        content[media] = {"schema": schema}
    return {"required": body.required, "content": content}


def _operation(op: Operation, components: dict[str, Schema]) -> Schema:
    error = {"$ref": REF.format(name=ErrorResponse.__name__)}
    responses: dict[str, Schema] = {
        status: {
            "description": "OK" if int(status) < 300 else status,
            "content": {media: {"schema": _ref(schema)} for media, schema in media_types.items()},
        }
        for status, media_types in op.ok.items()
    }
    for status, description in (("4XX", "Refused: whose fault, in OpenAI's error shape"),
                                ("5XX", "Server failure, in OpenAI's error shape")):  # fmt: skip
        responses.setdefault(
            status, {"description": description, "content": {"application/json": {"schema": error}}}
        )
    out: Schema = {
        "operationId": f"{op.method}_{op.path}".replace("/", "_").replace("{", "").replace("}", ""),
        "summary": op.summary,
        "responses": responses,
    }
    if op.params:
        out["parameters"] = [
            {"name": p.name, "in": p.where, "required": p.required, "schema": p.schema}
            for p in op.params
        ]
    if op.body is not None:
        out["requestBody"] = _request_body(op, components)
    return out


def document(operations: tuple[Operation, ...] = OPERATIONS) -> Schema:
    structs: list[Any] = [ErrorResponse, videos.VideoObject]
    structs += [op.body.struct for op in operations if op.body is not None]
    _, components = msgspec.json.schema_components(
        list(dict.fromkeys(structs)), schema_hook=_schema_hook, ref_template=REF
    )
    paths: dict[str, Schema] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method] = _operation(op, components)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "duplex-server",
            "version": __version__,
            "description": "OpenAI-compatible REST routes; the WebSocket protocol is PROTOCOL.md.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        # A key where the server has one (--api-key); none where it has none.
        "security": [{"bearer": []}, {}],
    }


@functools.cache
def _encoded() -> bytes:
    return msgspec.json.encode(document())


async def openapi_json(request: Request) -> Response:
    """The document, built once per process (the Structs do not change)."""
    return Response(_encoded(), media_type="application/json")
