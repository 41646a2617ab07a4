"""``/openapi.json``: every REST route, its bodies the Structs that validate
them (tests/e2e/test_openapi_fuzz.py fuzzes the routes from it)."""

from __future__ import annotations

from dataclasses import replace

import httpx
import jsonschema_rs  # schemathesis's own validator
import msgspec
from starlette.routing import Route

from duplex_bench.server_process import free_port
from duplex_server.app import create_app
from duplex_server.config import ServerConfig
from duplex_server.openapi import OPERATIONS, REF, document
from duplex_server.telephony.webhook import VOICE_PATH
from tests.conftest import running_server

# Routes the document leaves out, and why (duplex_server/openapi.py).
NOT_REST = {"/", VOICE_PATH}  # the browser page; Twilio's webhook


def served_operations() -> set[tuple[str, str]]:
    app = create_app(ServerConfig(store="memory", model="echo"))
    found = set()
    for route in app.routes:
        if isinstance(route, Route) and route.path not in NOT_REST:
            for method in route.methods or ():
                if method != "HEAD":  # Starlette answers HEAD for every GET
                    found.add((method.lower(), route.path))
    return found


def test_every_http_route_is_described_and_nothing_else():
    described = {(method, path) for path, item in document()["paths"].items() for method in item}
    assert described == served_operations()


def test_request_bodies_are_the_structs_schemas():
    doc = document()
    schemas = doc["components"]["schemas"]
    for op in OPERATIONS:
        if op.body is None:
            continue
        name = op.body.struct.__name__
        (_,), own = msgspec.json.schema_components(
            [op.body.struct],
            ref_template=REF,
            schema_hook=lambda t: {"description": "any JSON value"},
        )
        assert schemas[name] == own[name], name
        content = doc["paths"][op.path][op.method]["requestBody"]["content"]
        if "application/json" in content:
            assert content["application/json"]["schema"] == {"$ref": REF.format(name=name)}
        if "multipart/form-data" not in content:
            continue
        fields = schemas[name + "Form"]["properties"]
        assert {file for file, _ in op.body.files} <= set(fields)
        if op.body.part is not None:  # the Struct as one JSON part
            assert fields[op.body.part] == {"$ref": REF.format(name=name)}
        else:  # every field of the Struct is a form field (less those the route fills)
            assert set(own[name]["properties"]) - set(op.body.drop) <= set(fields), name


def test_a_field_added_to_a_struct_appears_in_the_document():
    from batch_api import speech

    class WiderSpeech(speech.SpeechRequest, forbid_unknown_fields=True):
        brand_new: int | None = None

    ops = tuple(
        replace(op, body=replace(op.body, struct=WiderSpeech))
        if op.path == speech.ROUTE and op.body is not None
        else op
        for op in OPERATIONS
    )
    doc = document(ops)
    body = doc["paths"][speech.ROUTE]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": REF.format(name="WiderSpeech")}
    assert "brand_new" in doc["components"]["schemas"]["WiderSpeech"]["properties"]


def test_the_schemas_are_json_schema_and_refusals_openai_errors():
    doc = document()
    for schema in doc["components"]["schemas"].values():
        jsonschema_rs.meta.validate(schema)
    error = doc["components"]["schemas"]["ErrorBody"]
    assert {"message", "type", "code", "param"} <= set(error["properties"])
    for path, item in doc["paths"].items():
        for method, op in item.items():
            refusal = op["responses"]["4XX"]["content"]["application/json"]["schema"]
            assert refusal == {"$ref": REF.format(name="ErrorResponse")}, (method, path)


async def test_the_server_serves_the_document():
    config = ServerConfig(port=free_port(), store="memory", model="echo", api_key="sk-doc")
    async with running_server(config) as server, httpx.AsyncClient() as http:
        response = await http.get(f"{server.http_url}/openapi.json")  # no key needed
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == msgspec.json.decode(msgspec.json.encode(document()))


async def test_starlettes_own_refusals_are_openai_shaped():
    config = ServerConfig(port=free_port(), store="memory", model="echo")
    async with running_server(config) as server, httpx.AsyncClient() as http:
        answers = [
            await http.post(f"{server.http_url}/health"),  # 405
            await http.get(f"{server.http_url}/v1/nothing"),  # 404
            await http.post(  # 400: a multipart body without a boundary
                f"{server.http_url}/v1/realtime/calls",
                headers={"content-type": "multipart/form-data"},
            ),
        ]
    assert [r.status_code for r in answers] == [405, 404, 400]
    assert [r.json()["error"]["code"] for r in answers] == [
        "method_not_allowed",
        "not_found",
        "invalid_offer",
    ]
    for response in answers:
        assert set(response.json()["error"]) >= {"message", "type", "code", "param"}
    assert "GET" in answers[0].headers["allow"]
