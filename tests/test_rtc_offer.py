"""``POST /v1/realtime/calls`` bodies: the offer checked before any peer
connection, the session config and a resume read from either place."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from duplex_server.webrtc.offer import check_offer, read_call_request
from protocol.errors import ProtocolError

OFFER = "\r\n".join(
    [
        "v=0",
        "o=- 1 1 IN IP4 0.0.0.0",
        "s=-",
        "t=0 0",
        "m=audio 9 UDP/TLS/RTP/SAVPF 111 0",
        "a=rtpmap:111 opus/48000/2",
        "a=rtpmap:0 PCMU/8000",
        "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
        "",
    ]
)


def request(body: bytes, content_type: str, query: str = "") -> Request:
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/realtime/calls",
        "query_string": query.encode(),
        "headers": [(b"content-type", content_type.encode())],
    }
    return Request(scope, receive)


def multipart(fields: dict[str, str]) -> tuple[bytes, str]:
    boundary = "xyzzy"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    return (
        "".join(parts) + f"--{boundary}--\r\n"
    ).encode(), f"multipart/form-data; boundary={boundary}"


def test_an_offer_with_opus_audio_passes():
    check_offer(OFFER)


@pytest.mark.parametrize(
    ("sdp", "code"),
    [
        ("hello", "invalid_offer"),
        (OFFER.split("m=audio")[0], "invalid_offer"),
        (OFFER.replace("opus/48000/2", "speex/16000"), "unsupported_codec"),
        # Opus offered for video only is not an audio codec.
        (OFFER.replace("m=audio", "m=video"), "invalid_offer"),
    ],
)
def test_an_offer_this_server_cannot_answer_is_refused(sdp, code):
    with pytest.raises(ProtocolError) as refused:
        check_offer(sdp)
    assert refused.value.code == code


async def test_the_bare_sdp_form_has_no_session():
    asked = await read_call_request(request(OFFER.encode(), "application/sdp"), 65536)
    assert asked.sdp == OFFER and asked.session is None and asked.resume is None


async def test_the_multipart_form_carries_the_session_and_a_resume():
    body, content_type = multipart(
        {
            "sdp": OFFER,
            "session": '{"type": "realtime", "instructions": "hi", "session_id": "sess_1",'
            ' "resume_token": "tok", "last_received_server_event_seq": 7}',
        }
    )
    asked = await read_call_request(request(body, content_type), 65536)
    assert asked.session is not None and asked.session.instructions == "hi"
    assert asked.resume is not None
    assert (asked.resume.session_id, asked.resume.resume_token) == ("sess_1", "tok")
    assert asked.resume.last_received_server_event_seq == 7


async def test_a_resume_may_be_named_in_the_query():
    query = "session_id=sess_2&resume_token=t&last_received_server_event_seq=12"
    asked = await read_call_request(request(OFFER.encode(), "application/sdp", query), 65536)
    assert asked.resume is not None and asked.resume.last_received_server_event_seq == 12


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"session": "{}"}, "invalid_offer"),  # no sdp
        ({"sdp": OFFER, "extra": "x"}, "invalid_offer"),  # an unknown field is refused
        ({"sdp": OFFER, "session": "[1]"}, "invalid_value"),
        ({"sdp": OFFER, "session": "{nope"}, "invalid_json"),
        ({"sdp": OFFER, "session": '{"voice": 7}'}, "invalid_value"),
        ({"sdp": OFFER, "session": '{"last_received_server_event_seq": -1}'}, "invalid_value"),
    ],
)
async def test_a_bad_form_is_refused_with_its_code(fields, code):
    body, content_type = multipart(fields)
    with pytest.raises(ProtocolError) as refused:
        await read_call_request(request(body, content_type), 65536)
    assert refused.value.code == code


async def test_another_content_type_is_refused():
    with pytest.raises(ProtocolError) as refused:
        await read_call_request(request(OFFER.encode(), "text/plain"), 65536)
    assert refused.value.code == "unsupported_content_type"
