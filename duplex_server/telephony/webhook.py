"""``POST /v1/telephony/twilio/voice``: Twilio asks what to do with a call.

The answer is TwiML connecting the call's audio to the media stream socket
on this same host (the URL Twilio signed, so the same proxy), with the
call's sid and numbers as the stream's parameters: Twilio refuses a query
string on a stream URL, and hands these back in the stream's ``start``
message. Only a request whose ``X-Twilio-Signature`` verifies is answered:
anyone can POST here, and an answer starts a session on the server's model.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from starlette.requests import Request
from starlette.responses import Response

from duplex_server.http_body import BodyTooLarge, read_limited
from duplex_server.http_errors import refusal
from duplex_server.telephony.twilio_signature import signed_url, verify_request

log = logging.getLogger(__name__)

VOICE_PATH = "/v1/telephony/twilio/voice"
STREAM_PATH = "/v1/telephony/twilio/stream"
MAX_BODY_BYTES = 64 * 1024
_STREAM_SCHEME = {"https": "wss", "http": "ws"}


async def twilio_voice(request: Request) -> Response:
    auth_token = request.app.state.config.twilio_auth_token
    if auth_token is None:
        return refusal(
            404,
            "telephony_not_configured",
            "telephony is off: start the server with --twilio-auth-token",
        )
    try:
        body = await read_limited(request, MAX_BODY_BYTES)
    except BodyTooLarge:
        return refusal(413, "payload_too_large", "the request body is too large")
    fields = dict(parse_qsl(body.decode("latin-1"), keep_blank_values=True))
    if not verify_request(request, fields, auth_token):
        log.warning("twilio voice webhook: refused a request whose signature does not verify")
        return refusal(403, "invalid_signature", "X-Twilio-Signature does not verify")
    call_sid = fields.get("CallSid")
    if not call_sid:
        return refusal(400, "invalid_value", "the webhook carries no CallSid", param="CallSid")
    twiml = _connect(stream_url(request), call_sid, fields.get("From", ""), fields.get("To", ""))
    return Response(twiml, media_type="text/xml")


def stream_url(request: Request) -> str:
    """The media stream's URL on the host Twilio called: the signed URL's
    scheme as a WebSocket's, the stream's path, no query string."""
    scheme, netloc, *_ = urlsplit(signed_url(request))
    return urlunsplit((_STREAM_SCHEME[scheme], netloc, STREAM_PATH, "", ""))


def _connect(url: str, call_sid: str, caller: str, called: str) -> str:
    """TwiML by the twilio package (it escapes the attribute values)."""
    from twilio.twiml.voice_response import Connect, Stream, VoiceResponse

    stream = Stream(url=url)
    stream.parameter(name="call_sid", value=call_sid)
    stream.parameter(name="from", value=caller)
    stream.parameter(name="to", value=called)
    connect = Connect()
    connect.append(stream)
    response = VoiceResponse()
    response.append(connect)
    return str(response.to_xml())
