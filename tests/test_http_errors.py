"""Every HTTP refusal in OpenAI's shape, with Retry-After where a client should retry."""

from __future__ import annotations

import json

import pytest

from duplex_server.http_errors import protocol_refusal, refusal
from duplex_server.transport import too_many
from protocol.errors import ProtocolError


@pytest.mark.parametrize(
    ("status", "code", "kind", "retry"),
    [
        (400, "invalid_value", "invalid_request_error", None),
        (401, "unauthorized", "authentication_error", None),
        (403, "invalid_signature", "authentication_error", None),
        (404, "session_not_found", "invalid_request_error", None),
        (429, "too_many_jobs", "rate_limit_error", "1"),
        (503, "resource_exhausted", "rate_limit_error", "1"),
        (503, "model_not_loaded", "server_error", "1"),
    ],
)
def test_a_refusal_has_openais_shape_and_retry_after_where_due(status, code, kind, retry):
    answer = refusal(status, code, "no", param="x")
    body = json.loads(answer.body)["error"]
    assert (body["type"], body["code"], body["message"], body["param"]) == (kind, code, "no", "x")
    assert answer.status_code == status
    assert answer.headers.get("retry-after") == retry


def test_a_protocol_error_keeps_its_class_and_param():
    answer = protocol_refusal(429, ProtocolError("rate_limited", "slow", param="type"))
    body = json.loads(answer.body)["error"]
    assert (body["type"], body["param"]) == ("rate_limit_error", "type")
    assert answer.headers["retry-after"] == "1"


def test_the_unread_connections_answer_is_a_whole_http_response():
    raw = too_many(3)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 429 Too Many Requests"
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert headers["retry-after"] == "3" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body)["error"]["code"] == "rate_limited"
    assert too_many(3) is raw  # built once
