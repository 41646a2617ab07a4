"""How the server's log lines look: text for a terminal, or one JSON object
a line for a log pipeline (``--log-format json``).

A JSON line has ``ts`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``,
``message``, and ``session_id`` and ``response_id``: set on every line
logged while serving a session (the session actor binds them, see
``sessions.runtime.log_context``), ``null`` elsewhere, so that a pipeline
can filter one session's or one answer's lines. A traceback goes into
``exception``. The fields a call passed in ``extra=`` follow, each under its
own name (``log.info("job ended", extra={"job_id": ..., "seconds": ...})``),
a value JSON cannot hold as its ``str``; a name the line has already (``ts``,
``level``, ...) keeps the line's value. Every line of the process takes this
shape, uvicorn's included.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from duplex_server.sessions.runtime import log_context

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(levelname)s:     %(name)s: %(message)s"
# Loggers that uvicorn gives handlers of their own; everything else reaches the root's.
_LOGGERS = (None, "uvicorn", "uvicorn.error", "uvicorn.access")
# What every record has: anything else on one came from ``extra=``.
_RECORD_FIELDS = frozenset(
    [*vars(logging.LogRecord("", 0, "", 0, "", (), None)), "message", "asctime", "taskName"]
)
# ``extra=`` fields that are not the caller's facts: uvicorn's coloured copy of the message.
_NOT_EXTRA = frozenset(["color_message", "session_id", "response_id"])


_factory_fields: dict[object, frozenset[str]] = {}


def _record_fields() -> frozenset[str]:
    """What every record has, with the fields the installed record factory
    adds to all of them (vLLM's adds ``vllm_process_name``): not extras."""
    factory = logging.getLogRecordFactory()
    if factory not in _factory_fields:
        made = factory("", 0, "", 0, "", (), None)
        _factory_fields[factory] = _RECORD_FIELDS | frozenset(vars(made))
    return _factory_fields[factory]


class SessionFields(logging.Filter):
    """Stamps a record with the session (and response) it was logged for."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.session_id, record.response_id = log_context.current()
        return True


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "session_id": getattr(record, "session_id", None),
            "response_id": getattr(record, "response_id", None),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        fixed = _record_fields()
        for name, value in vars(record).items():
            if name not in fixed and name not in _NOT_EXTRA and name not in line:
                line[name] = value
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(level: str) -> None:
    """The root logger, before uvicorn adds its own; :func:`install` then
    gives every handler the chosen shape."""
    logging.basicConfig(level=level.upper(), format=TEXT_FORMAT)


def install(log_format: str) -> None:
    """Put the session fields on every handler that writes the server's
    logs and, for ``json``, the JSON shape (call once uvicorn configured its
    loggers)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    seen: set[int] = set()
    for name in _LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if id(handler) in seen:
                continue
            seen.add(id(handler))
            handler.addFilter(SessionFields())
            if log_format == "json":
                handler.setFormatter(JsonLines())
