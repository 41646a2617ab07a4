"""Capability gates on a real server: a model without resume refuses every
resume, and a field a model fixes at open cannot be changed by session.update
(tests/test_gates.py runs every gate through the pure step)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

from duplex_bench.server_process import free_port
from duplex_server.config import ServerConfig
from tests.conftest import RunningServer, running_server
from tests.wsclient import WsClient


@pytest.fixture
async def no_resume() -> AsyncIterator[RunningServer]:
    """Echo on the memory store, declared (as a model may be) without resume."""
    async with running_server(ServerConfig(port=free_port(), model="echo")) as running:
        model = running.app.state.model  # type: ignore[attr-defined]
        model.capabilities = msgspec.structs.replace(
            model.capabilities, supports_session_resume=False
        )
        yield running


async def _resume(server: RunningServer, session_id: str, token: str) -> dict:
    client = await WsClient.connect(server.ws_url + "&autostart=0")
    await client.send(
        {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": token,
            "last_received_server_event_seq": 0,
            "event_id": "evt_resume",
        }
    )
    error = await client.expect("error")
    await client.close()
    return error["error"]


async def test_a_model_without_resume_refuses_every_resume(no_resume):
    client, created = await no_resume.open()
    session_id = created["session"]["id"]
    assert created["session"]["capabilities"]["supports_session_resume"] is False
    await client.close()  # detached: the session is still there, waiting
    # The right token, a wrong one, an unknown session: the same answer, and
    # none of them counts as a guess (the socket is not closed for them).
    for target, token in (
        (session_id, created["resume_token"] or "t"),
        (session_id, "x" * 22),
        ("sess_nosuchsession", "t"),
    ):
        error = await _resume(no_resume, target, token)
        assert error["code"] == "unsupported_session_resume"
        assert error["type"] == "invalid_request_error" and error["event_id"] == "evt_resume"
    assert session_id in no_resume.manager.actors  # nothing was attached or moved


async def test_a_model_without_resume_issues_no_token(no_resume):
    client, created = await no_resume.open()
    assert created["resume_token"] is None
    await client.close()


async def test_the_model_of_an_open_session_is_fixed(server):
    client, created = await server.open()
    model = created["session"]["model"]
    await client.send(
        {"type": "session.update", "session": {"model": "another"}, "event_id": "evt_m"}
    )
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"], error["event_id"]) == (
        "model_update_unsupported",
        "session.model",
        "evt_m",
    )
    # The same name again is no change; the session carries on.
    await client.send({"type": "session.update", "session": {"model": model}})
    updated = await client.expect("session.updated")
    assert updated["session"]["model"] == model
