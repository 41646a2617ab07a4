"""Twilio's voice webhook: only signed requests are answered, with TwiML that
connects the call to the media stream on the host Twilio called (behind a
proxy too); the call configs file and the signature check on their own."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlencode

import pytest
from starlette.applications import Starlette
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.testclient import TestClient
from twilio.request_validator import RequestValidator

from duplex_server.config import ServerConfig
from duplex_server.telephony.call_config import CallConfigs
from duplex_server.telephony.twilio_signature import signed_url, verify_request
from duplex_server.telephony.webhook import MAX_BODY_BYTES, STREAM_PATH, VOICE_PATH, twilio_voice
from protocol.session_config import SessionUpdate, TurnDetection

TOKEN = "12345678901234567890123456789012"
CALL = {
    "CallSid": "CA0123456789abcdef0123456789abcdef",
    "AccountSid": "AC0123456789abcdef0123456789abcdef",
    "From": "+15550001111",
    "To": "+15551234567",
    "CallStatus": "ringing",
    "CallerName": "",
}
FORM = {"content-type": "application/x-www-form-urlencoded"}


def make_client(token: str | None = TOKEN, configs: CallConfigs | None = None) -> TestClient:
    app = Starlette(routes=[Route(VOICE_PATH, twilio_voice, methods=["POST"])])
    app.state.config = ServerConfig(twilio_auth_token=token)
    app.state.call_configs = configs or CallConfigs.load(None)
    return TestClient(app, base_url="http://internal:8000")


def signature(url: str, params: dict[str, str] = CALL) -> str:
    return RequestValidator(TOKEN).compute_signature(url, params)


def post(client: TestClient, headers: dict[str, str], params: dict[str, str] = CALL):
    return client.post(VOICE_PATH, content=urlencode(params), headers={**FORM, **headers})


def stream_of(twiml: str) -> ET.Element:
    root = ET.fromstring(twiml)
    assert root.tag == "Response"
    stream = root.find("./Connect/Stream")
    assert stream is not None, twiml
    return stream


def parameters(stream: ET.Element) -> dict[str, str]:
    return {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}


def assert_refused(response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error["type"] and error["message"]


def test_signed_call_gets_twiml_connecting_the_stream():
    client = make_client()
    url = f"http://internal:8000{VOICE_PATH}"
    response = post(client, {"X-Twilio-Signature": signature(url)})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/xml")
    stream = stream_of(response.text)
    assert stream.attrib["url"] == f"ws://internal:8000{STREAM_PATH}"
    assert parameters(stream) == {
        "call_sid": CALL["CallSid"],
        "from": CALL["From"],
        "to": CALL["To"],
    }


def test_wrong_signature_is_refused():
    client = make_client()
    wrong = RequestValidator("another-token").compute_signature(
        f"http://internal:8000{VOICE_PATH}", CALL
    )
    assert_refused(post(client, {"X-Twilio-Signature": wrong}), 403, "invalid_signature")


def test_signature_of_other_fields_is_refused():
    client = make_client()
    url = f"http://internal:8000{VOICE_PATH}"
    forged = {**CALL, "To": "+15559999999"}
    response = post(client, {"X-Twilio-Signature": signature(url)}, forged)
    assert_refused(response, 403, "invalid_signature")


def test_missing_signature_is_refused():
    assert_refused(post(make_client(), {}), 403, "invalid_signature")


def test_missing_call_sid_is_refused():
    client = make_client()
    params = {k: v for k, v in CALL.items() if k != "CallSid"}
    url = f"http://internal:8000{VOICE_PATH}"
    response = post(client, {"X-Twilio-Signature": signature(url, params)}, params)
    assert_refused(response, 400, "invalid_value")


@pytest.mark.parametrize(
    "proxy_headers",
    [
        {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "calls.example.com"},
        {"X-Forwarded-Proto": "https, http", "X-Forwarded-Host": "calls.example.com, internal"},
        {"Forwarded": "proto=https;host=calls.example.com"},
        {"Forwarded": 'for=192.0.2.1;proto=https;host="calls.example.com", proto=http'},
    ],
)
def test_behind_a_proxy_the_public_url_is_signed_and_streamed(proxy_headers):
    client = make_client()
    public = f"https://calls.example.com{VOICE_PATH}"
    response = post(client, {**proxy_headers, "X-Twilio-Signature": signature(public)})
    assert response.status_code == 200, response.text
    assert stream_of(response.text).attrib["url"] == f"wss://calls.example.com{STREAM_PATH}"


def test_behind_a_proxy_the_internal_url_does_not_verify():
    client = make_client()
    internal = f"http://internal:8000{VOICE_PATH}"
    headers = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "calls.example.com"}
    response = post(client, {**headers, "X-Twilio-Signature": signature(internal)})
    assert_refused(response, 403, "invalid_signature")


def test_without_a_token_telephony_is_not_found():
    client = make_client(token=None)
    url = f"http://internal:8000{VOICE_PATH}"
    response = post(client, {"X-Twilio-Signature": signature(url)})
    assert_refused(response, 404, "telephony_not_configured")
    assert "--twilio-auth-token" in response.json()["error"]["message"]


def test_oversized_body_is_refused():
    client = make_client()
    params = {**CALL, "Padding": "x" * (MAX_BODY_BYTES + 1)}
    url = f"http://internal:8000{VOICE_PATH}"
    response = post(client, {"X-Twilio-Signature": signature(url, params)}, params)
    assert_refused(response, 413, "payload_too_large")


# -- the call configs file -----------------------------------------------------


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "calls.toml"
    path.write_text(text)
    return str(path)


def test_number_table_is_laid_over_the_default(tmp_path):
    path = write(
        tmp_path,
        """
[default]
instructions = "You answer for Example Ltd."
voice = "alloy"
temperature = 0.7

[numbers."+15551234567"]
voice = "verse"
turn_detection = { type = "server_vad", silence_duration_ms = 400 }
""",
    )
    configs = CallConfigs.load(path)
    called = configs.for_number("+15551234567")
    assert called.voice == "verse"
    assert called.instructions == "You answer for Example Ltd."
    assert called.temperature == 0.7
    assert called.turn_detection == TurnDetection(silence_duration_ms=400)
    other = configs.for_number("+15550000000")
    assert other.voice == "alloy"
    assert other == configs.default


def test_bad_table_is_refused_by_name(tmp_path):
    path = write(
        tmp_path, '[default]\nvoice = "alloy"\n\n[numbers."+15551234567"]\ntemperature = 9\n'
    )
    with pytest.raises(ValueError, match=r'calls\.toml.*\[numbers\."\+15551234567"\]'):
        CallConfigs.load(path)


def test_misspelt_session_field_is_refused(tmp_path):
    path = write(tmp_path, '[default]\ninstruction = "hello"\n')
    with pytest.raises(ValueError, match=r"\[default\].*instruction"):
        CallConfigs.load(path)


def test_unknown_table_is_refused_by_name(tmp_path):
    path = write(tmp_path, '[default]\nvoice = "alloy"\n\n[number."+15551234567"]\nvoice = "x"\n')
    with pytest.raises(ValueError, match=r"unknown table.*'number'"):
        CallConfigs.load(path)


def test_not_toml_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"calls\.toml: not TOML"):
        CallConfigs.load(write(tmp_path, "[default\n"))


def test_no_file_gives_every_call_the_empty_config():
    configs = CallConfigs.load(None)
    assert configs.for_number("+15551234567") == SessionUpdate()


def test_webhook_answers_a_configured_number(tmp_path):
    path = write(tmp_path, '[numbers."+15551234567"]\nvoice = "verse"\n')
    client = make_client(configs=CallConfigs.load(path))
    url = f"http://internal:8000{VOICE_PATH}"
    assert post(client, {"X-Twilio-Signature": signature(url)}).status_code == 200


# -- the media stream's signature ------------------------------------------------


def websocket_connection(headers: dict[str, str], scheme: str = "ws") -> HTTPConnection:
    raw = [(b"host", b"internal:8000")]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {
        "type": "websocket",
        "scheme": scheme,
        "server": ("internal", 8000),
        "path": STREAM_PATH,
        "raw_path": STREAM_PATH.encode(),
        "query_string": b"",
        "headers": raw,
    }
    return HTTPConnection(scope)


def test_media_stream_signs_the_wss_url_behind_a_proxy():
    public = f"wss://calls.example.com{STREAM_PATH}"
    proxy = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "calls.example.com"}
    sig = RequestValidator(TOKEN).compute_signature(public, {})
    connection = websocket_connection({**proxy, "X-Twilio-Signature": sig})
    assert signed_url(connection) == public
    assert verify_request(connection, {}, TOKEN)
    https_sig = RequestValidator(TOKEN).compute_signature(
        f"https://calls.example.com{STREAM_PATH}", {}
    )
    assert not verify_request(
        websocket_connection({**proxy, "X-Twilio-Signature": https_sig}), {}, TOKEN
    )


def test_signed_url_keeps_path_and_query_and_adds_a_forwarded_port():
    scope = {
        "type": "http",
        "scheme": "http",
        "server": ("internal", 8000),
        "path": "/v1/a b",
        "raw_path": b"/v1/a%20b",
        "query_string": b"x=1&y=%2F",
        "headers": [
            (b"host", b"internal:8000"),
            (b"x-forwarded-proto", b"https"),
            (b"x-forwarded-host", b"calls.example.com"),
            (b"x-forwarded-port", b"8443"),
        ],
    }
    assert signed_url(HTTPConnection(scope)) == "https://calls.example.com:8443/v1/a%20b?x=1&y=%2F"


def test_verify_request_without_a_signature_is_false():
    assert not verify_request(websocket_connection({}), {}, TOKEN)
