"""``--log-format json``: the fields a call passes in ``extra=`` are fields
of its line, beside the fixed ones, which they never replace."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from duplex_server.log_format import JsonLines, SessionFields


def line_of(record: logging.LogRecord) -> dict:
    SessionFields().filter(record)
    return json.loads(JsonLines().format(record))


def record(extra: dict[str, object]) -> logging.LogRecord:
    logger = logging.getLogger("test.log_format.extra")
    return logger.makeRecord(
        logger.name, logging.INFO, __file__, 1, "job %s ended", ("j1",), None, extra=extra
    )


def test_extra_fields_are_fields_of_the_line():
    line = line_of(record({"job_id": "j1", "seconds": 1.5, "path": Path("/tmp/x"), "n": None}))
    assert line["message"] == "job j1 ended"
    assert (line["job_id"], line["seconds"], line["n"]) == ("j1", 1.5, None)
    assert line["path"] == "/tmp/x"  # what JSON cannot hold, as its str
    assert line["level"] == "info" and line["session_id"] is None


def test_a_line_without_extra_has_only_the_fixed_fields():
    line = line_of(record({}))
    assert set(line) == {"ts", "level", "logger", "message", "session_id", "response_id"}


def test_an_extra_field_does_not_replace_a_fixed_one_and_uvicorns_colour_is_left_out():
    line = line_of(record({"level": "quiet", "ts": 0, "color_message": "\x1b[1mjob\x1b[0m"}))
    assert line["level"] == "info" and line["ts"] != 0
    assert "color_message" not in line
