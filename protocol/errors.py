"""Error classes and codes of the wire contract (PROTOCOL.md, "Errors")."""

from __future__ import annotations

import msgspec

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
RATE_LIMIT = "rate_limit_error"
AUTHENTICATION = "authentication_error"

# code -> error class. The class is implied by the code so that callers name
# only the code and cannot pair it with the wrong class.
ERROR_CLASS: dict[str, str] = {
    "invalid_json": INVALID_REQUEST,
    "unknown_event_type": INVALID_REQUEST,
    "invalid_event": INVALID_REQUEST,
    "invalid_audio": INVALID_REQUEST,
    "invalid_value": INVALID_REQUEST,
    "input_audio_buffer_empty": INVALID_REQUEST,
    "input_audio_buffer_full": INVALID_REQUEST,
    "response_create_without_input": INVALID_REQUEST,
    "response_not_found": INVALID_REQUEST,
    "response_cancel_not_active": INVALID_REQUEST,  # OpenAI's: nothing to cancel
    "model_not_found": INVALID_REQUEST,
    "item_not_found": INVALID_REQUEST,
    "unknown_function_call": INVALID_REQUEST,
    "stale_function_call_output": INVALID_REQUEST,
    "duplicate_function_call_output": INVALID_REQUEST,
    "unsupported_turn_detection": INVALID_REQUEST,
    "capability_unsupported": INVALID_REQUEST,
    "native_text_append_unsupported": INVALID_REQUEST,
    "stale_epoch": INVALID_REQUEST,
    "session_not_open": INVALID_REQUEST,
    "config_timeout": INVALID_REQUEST,
    "session_resume_expired": INVALID_REQUEST,
    "invalid_resume_token": INVALID_REQUEST,
    "invalid_session_resume": INVALID_REQUEST,
    "session_resume_conflict": INVALID_REQUEST,
    "unsupported_session_resume": INVALID_REQUEST,
    "duplicate_event": INVALID_REQUEST,
    "event_id_reused": INVALID_REQUEST,
    "model_update_unsupported": INVALID_REQUEST,
    "voice_update_after_audio_unsupported": INVALID_REQUEST,
    "instructions_update_unsupported": INVALID_REQUEST,
    "temperature_update_unsupported": INVALID_REQUEST,
    "config_update_mid_utterance": INVALID_REQUEST,  # speech stream: after input.text
    # A transcription session asked for a response; a session's type changed
    # after it heard or said something.
    "unsupported_for_session_type": INVALID_REQUEST,
    "session_type_update_unsupported": INVALID_REQUEST,
    "resource_exhausted": RATE_LIMIT,
    "rate_limited": RATE_LIMIT,
    "payload_too_large": INVALID_REQUEST,
    "unauthorized": AUTHENTICATION,
    "forbidden": AUTHENTICATION,
    "session_expired": INVALID_REQUEST,  # OpenAI's, where session.expired is not sent
    "call_not_found": INVALID_REQUEST,  # a sideband socket's call_id names no live call
    "sideband_event_not_allowed": INVALID_REQUEST,  # a sideband socket steers, not streams
    # POST /v1/realtime/calls (WebRTC): an offer that is no SDP or has no
    # audio, one without Opus, a body in neither of OpenAI's two forms.
    "invalid_offer": INVALID_REQUEST,
    "unsupported_codec": INVALID_REQUEST,
    "unsupported_content_type": INVALID_REQUEST,
    # Binary audio (protocol/audio_frames.py): a frame this version cannot
    # read; ?audio=binary off the duplex wire.
    "invalid_audio_frame": INVALID_REQUEST,
    "binary_audio_unsupported": INVALID_REQUEST,
    "engine_error": SERVER_ERROR,
    "storage_unavailable": SERVER_ERROR,
}


class ProtocolError(Exception):
    """A rejected client event, carrying everything the error envelope needs."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
    ) -> None:
        if code not in ERROR_CLASS:
            raise ValueError(f"undocumented error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id

    @property
    def error_class(self) -> str:
        return ERROR_CLASS[self.code]

    def forget_traceback(self) -> None:
        """Called where the error becomes a message to the client. Its
        traceback is of no use from there, and it ties the error into a
        cycle with the frames that raised it (a handler's context, a
        mailbox message's future, often holds the very error), which only
        the cyclic GC would free, in one long pause (docs/decisions/session-log-and-actor.md)."""
        self.__traceback__ = None


class ErrorBody(msgspec.Struct):
    type: str
    code: str
    message: str
    event_id: str | None = None
    param: str | None = None


def error_body(err: ProtocolError) -> ErrorBody:
    return ErrorBody(
        type=err.error_class,
        code=err.code,
        message=err.message,
        event_id=err.event_id,
        param=err.param,
    )
