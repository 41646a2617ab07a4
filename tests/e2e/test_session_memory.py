"""A closed session leaves memory when it closes, not when the cyclic GC
comes round: ``serve`` raises the GC's thresholds out of the latency tail
(docs/decisions/session-log-and-actor.md), so anything a session leaves in a reference cycle (its
actor holds its journal and its buffered audio) would stay for minutes. The
``bench abuse`` bystanders showed it: a server whose sessions were closed
and reopened every few seconds grew by their whole logs, 25 MB a round."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from tests.e2e.test_streaming_port import append_units, quiet
from tests.wsclient import tone_pcm16

SCRIPTED = pytest.mark.server_config(model="scripted")


async def _talk(client, model: str) -> None:
    """One answer, from a model that takes turns or one that streams."""
    if model == "echo":
        await client.append(tone_pcm16(200))
        await client.send({"type": "input_audio_buffer.commit"})
    else:
        from duplex_server.models.scripted import LISTEN_UNITS, SPEAK_UNITS

        await append_units(client, quiet(80 * (LISTEN_UNITS + SPEAK_UNITS + 2)))
    await client.recv_until("response.done", timeout=20.0)


@pytest.mark.parametrize("model", ["echo", pytest.param("scripted", marks=SCRIPTED)])
async def test_a_closed_session_is_freed_without_the_cyclic_gc(server, model):
    gc.collect()
    gc.disable()
    try:
        client, created = await server.open()
        session_id = created["session"]["id"]
        actor = server.manager.actors[session_id]
        loop_task = actor._task
        assert loop_task is not None
        freed = weakref.ref(actor)
        del actor
        await _talk(client, model)
        await client.send({"type": "session.close"})
        await client.recv_until("session.closed")
        await client.close()
        await asyncio.wait({loop_task})
        for _ in range(3):  # the done-callbacks of the loop's task
            await asyncio.sleep(0)
        assert session_id not in server.manager.actors
        if freed() is not None:
            holders = [type(o).__qualname__ for o in gc.get_referrers(freed())]
            pytest.fail(f"the closed session's actor is still held by {holders}")
    finally:
        gc.enable()


OURS = ("duplex_server.", "protocol.", "uvicorn.protocols.", "httptools.")


async def test_refusals_and_upgrades_leave_no_cyclic_garbage(server):
    """What refusing costs must not wait for the GC either: a refused event's
    error (its traceback ties it to the frames that raised it), a refused
    resume, an upgraded connection's HTTP parser."""
    gc.collect()
    gc.disable()
    try:
        client, created = await server.open()
        await client.send({"type": "input_audio_buffer.append", "audio": "@@", "event_id": "a"})
        assert (await client.expect("error"))["error"]["code"] == "invalid_audio"
        await client.send({"type": "input_audio_buffer.commit", "event_id": "c"})
        assert (await client.expect("error"))["error"]["code"] == "input_audio_buffer_empty"
        guesser = await server.connect("autostart=0")
        await guesser.send(
            {
                "type": "session.resume",
                "session_id": created["session"]["id"],
                "resume_token": "a-guess",
                "last_received_server_event_seq": 0,
            }
        )
        assert (await guesser.expect("error"))["error"]["code"] == "invalid_resume_token"
        await guesser.close()
        await client.send({"type": "session.close"})
        await client.recv_until("session.closed")
        await client.close()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = sorted(
            {type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith(OURS)}
        )
        assert not left, f"left for the cyclic GC: {left}"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.server_config(ended_sessions_kept=3)
async def test_the_memory_of_ended_sessions_is_bounded(server):
    """A replica remembers how the last ``--ended-sessions-kept`` sessions
    ended, not every session it ever served; nothing else of theirs stays."""
    manager = server.manager
    ended = []
    for _ in range(5):
        client, created = await server.open()
        loop_task = manager.actors[created["session"]["id"]]._task
        assert loop_task is not None
        await client.send({"type": "session.close"})
        await client.recv_until("session.closed")
        await client.close()
        await asyncio.wait({loop_task})  # then the manager has noted how it ended
        ended.append(created["session"]["id"])
    assert [manager.ended_reason(s) for s in ended] == [None, None] + ["client_close"] * 3
    assert not manager.actors
