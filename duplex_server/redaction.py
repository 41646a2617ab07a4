"""Secrets never reach a log line or a printed setting.

API keys (an ``Authorization`` header, a ``Bearer`` value, the browser's
``openai-insecure-api-key.<key>`` subprotocol), resume tokens, the password
in a store URL, a Twilio signature and phone numbers (personal data) are
replaced by ``[redacted]`` in every record the server's log handlers write,
whatever logger made it (ours, uvicorn's, websockets' debug dumps of
handshakes and frames) and at every level.
"""

from __future__ import annotations

import logging
import re

REDACTED = "[redacted]"

_PATTERNS = [
    (re.compile(r"(?i)(authorization[\"']?\s*[:=,]\s*[\"']?)[^\r\n\"',)]+"), rf"\1{REDACTED}"),
    (re.compile(r"(?i)(bearer\s+)[^\s\"',)]+"), rf"\1{REDACTED}"),
    (re.compile(r"(openai-insecure-api-key\.)[^\s\"',)\]]+"), rf"\1{REDACTED}"),
    (re.compile(r"(\"?resume_token\"?\s*[:=]\s*\\?[\"']?)[A-Za-z0-9_\-]+"), rf"\1{REDACTED}"),
    (re.compile(r"(?i)(rediss?://[^:/@\s]*:)[^@\s]+@"), rf"\1{REDACTED}@"),
    # A phone number (E.164, as carriers send them) is personal data.
    (re.compile(r"\+\d{7,15}\b"), REDACTED),
    (re.compile(r"(?i)(x-twilio-signature[\"']?\s*[:=,]\s*[\"']?)[^\r\n\"',)]+"), rf"\1{REDACTED}"),
]


def redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def install() -> None:
    """Put the filter on every handler that writes the server's logs (call
    once logging is configured: after uvicorn's own set-up)."""
    seen: set[int] = set()
    for name in (None, "uvicorn", "uvicorn.error", "uvicorn.access", "websockets"):
        for handler in logging.getLogger(name).handlers:
            if id(handler) not in seen:
                seen.add(id(handler))
                handler.addFilter(RedactingFilter())
