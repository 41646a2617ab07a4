"""``--log-format json``: one object a line, naming the session and the
response a line was logged for (the actor binds them, see
``sessions.runtime.log_context``)."""

from __future__ import annotations

import asyncio
import json
import logging

from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from duplex_server.log_format import JsonLines, SessionFields
from duplex_server.sessions.runtime import log_context
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.actor import SessionActor
from tests.conftest import running_server
from tests.wsclient import tone_pcm16


class Lines(logging.Handler):
    """The JSON lines a handler set up as ``install("json")`` would write."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(SessionFields())
        self.setFormatter(JsonLines())
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


class _Response:
    def __init__(self, response_id: str) -> None:
        self.id = response_id


def capture(name: str) -> Lines:
    handler = Lines()
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler


async def test_a_line_names_its_session_and_response_and_others_null():
    lines = capture("test.log_format.unit")
    log = logging.getLogger("test.log_format.unit")
    response: list[_Response | None] = [None]
    try:
        log.info("outside")

        async def serving() -> None:
            log_context.bind("sess_1", lambda: response[0])
            log.info("no response yet")
            response[0] = _Response("resp_1")
            await asyncio.create_task(asyncio.to_thread(log.warning, "in a thread of a child"))
            try:
                raise RuntimeError("boom")
            except RuntimeError:
                log.exception("failed")

        await asyncio.create_task(serving())
        log.info("outside again")  # the binding stayed in the session's task
    finally:
        logging.getLogger("test.log_format.unit").removeHandler(lines)

    by_message = {line["message"]: line for line in lines.lines}
    assert set(by_message["outside"]) == {
        "ts", "level", "logger", "message", "session_id", "response_id",
    }  # fmt: skip
    assert by_message["outside"]["session_id"] is None
    assert by_message["outside again"]["session_id"] is None
    assert by_message["no response yet"]["session_id"] == "sess_1"
    assert by_message["no response yet"]["response_id"] is None
    threaded = by_message["in a thread of a child"]
    assert (threaded["session_id"], threaded["response_id"], threaded["level"]) == (
        "sess_1",
        "resp_1",
        "warning",
    )
    assert "RuntimeError: boom" in by_message["failed"]["exception"]
    assert by_message["failed"]["ts"].endswith("Z")
    assert by_message["failed"]["logger"] == "test.log_format.unit"


async def test_the_actor_binds_its_session_and_the_response_in_progress(monkeypatch):
    """Lines logged in a real actor's task, while it streams an answer, carry
    the ids the client was told."""
    probe = logging.getLogger("test.log_format.actor")
    on_model = SessionActor._on_model
    on_client = SessionActor._on_client

    async def chunks_logged(self, message):
        if isinstance(message, mb.Chunks):
            probe.info("chunks")
        await on_model(self, message)

    async def client_logged(self, event, received_at):
        probe.info("client event")
        await on_client(self, event, received_at)

    monkeypatch.setattr(SessionActor, "_on_model", chunks_logged)
    monkeypatch.setattr(SessionActor, "_on_client", client_logged)
    lines = capture("test.log_format.actor")
    try:
        config = ServerConfig(port=free_port(), store="memory", model="echo")
        async with running_server(config) as server:
            client, created = await server.open()
            await client.append(tone_pcm16(300))
            await client.send({"type": "input_audio_buffer.commit"})
            events = await client.recv_until("response.done")
            await client.close()
    finally:
        logging.getLogger("test.log_format.actor").removeHandler(lines)

    session_id = created["session"]["id"]
    response_ids = {e["response"]["id"] for e in events if e["type"] == "response.created"}
    assert len(response_ids) == 1
    client_lines = [line for line in lines.lines if line["message"] == "client event"]
    chunk_lines = [line for line in lines.lines if line["message"] == "chunks"]
    assert client_lines and chunk_lines
    assert {line["session_id"] for line in client_lines + chunk_lines} == {session_id}
    assert {line["response_id"] for line in chunk_lines} == response_ids
