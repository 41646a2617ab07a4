"""The streaming model port through the real server: the ``scripted`` model
takes every 80 ms unit as it arrives, speaks on its schedule with one
response held open across units, and yields when the user's energy rises.
The ``server`` fixture runs each scenario on every store and checks that
refolding the log gives the live state."""

from __future__ import annotations

import base64

import pytest

from duplex_server.models.scripted import LISTEN_UNITS, SPEAK_UNITS, WORDS
from tests.e2e.sequences import AUDIO_CHUNK, RESPONSE_CLOSE, RESPONSE_OPEN
from tests.wsclient import WsClient, tone_pcm16, types_of

pytestmark = pytest.mark.server_config(model="scripted")

UNIT_MS = 80
RESPONSE_TIMEOUT_S = 20.0


def quiet(ms: float) -> bytes:
    return bytes(24_000 * int(ms) // 1000 * 2)


async def append_units(client: WsClient, pcm: bytes) -> None:
    step = 24_000 * UNIT_MS // 1000 * 2
    for at in range(0, len(pcm), step):
        await client.append(pcm[at : at + step])


async def test_the_model_takes_the_floor_on_its_schedule(server):
    client, _ = await server.open()
    await append_units(client, quiet(UNIT_MS * (LISTEN_UNITS + SPEAK_UNITS + 2)))
    events = await client.recv_until("response.done", timeout=RESPONSE_TIMEOUT_S)
    # no commit was sent: the model decided to speak by itself
    assert "input_audio_buffer.committed" not in types_of(events)
    expected = RESPONSE_OPEN + AUDIO_CHUNK * SPEAK_UNITS + RESPONSE_CLOSE
    # up to response.done: the rate_limits.updated that closes RESPONSE_CLOSE comes after it
    answer = events[types_of(events).index("response.created") :]
    assert [t for t in types_of(answer) if t != "turn.event"] == expected[:-1]
    # the floor changes hands as turn.events: once the first unit's audio went out
    phases = [e["event"] for e in answer if e["type"] == "turn.event"]
    assert phases == ["assistant_playing"]
    done = events[-1]["response"]
    assert done["status"] == "completed"
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )
    assert len(audio) == SPEAK_UNITS * 24_000 * UNIT_MS // 1000 * 2  # one unit of tone each
    transcript = next(e for e in events if e["type"] == "response.output_audio_transcript.done")
    assert transcript["transcript"] == " ".join(WORDS[:SPEAK_UNITS])
    # giving the floor back is a listen decision; the client still plays the
    # answer until it says it played all of it, then the floor is free
    after = await client.recv_until("response.listen")
    assert after[-1]["reason"] == "model_end_of_turn"
    await client.send(
        {"type": "playback.ack", "played_ms": SPEAK_UNITS * UNIT_MS, "response_id": done["id"]}
    )
    acked = await client.recv_until("turn.event")
    # one ack plays the whole answer: the output buffer started and stopped
    assert types_of(acked) == [
        "output_audio_buffer.started",
        "playback.acknowledged",
        "output_audio_buffer.stopped",
        "turn.event",
    ]
    assert acked[-1]["event"] == "idle"


async def test_the_model_yields_when_the_user_talks_over_it(server):
    client, _ = await server.open()
    await append_units(client, quiet(UNIT_MS * (LISTEN_UNITS + 2)))
    await client.recv_until("response.speak", timeout=RESPONSE_TIMEOUT_S)
    await append_units(client, tone_pcm16(UNIT_MS * 3, amp=12_000))
    events = await client.recv_until("response.done", timeout=RESPONSE_TIMEOUT_S)
    done = events[-1]["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "turn_detected"
    assert done["duplex"]["reason"] == "model_yield"
    after = await client.recv_until("turn.event")
    listened = next(e for e in after if e["type"] == "response.listen")
    assert listened["reason"] == "model_yield" and after[-1]["event"] == "user_speaking"
    # ... and while the user goes on talking it keeps listening
    await append_units(client, tone_pcm16(UNIT_MS * (LISTEN_UNITS + 2), amp=12_000))
    await client.send({"type": "session.heartbeat"})
    events = await client.recv_until("session.heartbeat_ack")
    assert "response.created" not in types_of(events)


async def test_the_server_clocks_silence_while_the_client_is_quiet(server):
    """No audio at all: silence units keep the model's time, so it still
    speaks on schedule."""
    client, _ = await server.open()
    events = await client.recv_until("response.done", timeout=RESPONSE_TIMEOUT_S)
    assert events[-1]["response"]["status"] == "completed"
    assert "input_audio_buffer.committed" not in types_of(events)


async def test_a_cancel_interrupts_the_model(server):
    client, _ = await server.open()
    await append_units(client, quiet(UNIT_MS * (LISTEN_UNITS + 1)))
    created = (await client.recv_until("response.speak", timeout=RESPONSE_TIMEOUT_S))[-1]
    await client.send({"type": "response.cancel"})
    events = await client.recv_until("response.done", timeout=RESPONSE_TIMEOUT_S)
    done = events[-1]["response"]
    assert (done["id"], done["status"]) == (created["response_id"], "cancelled")
    # the fenced answer sends nothing more; the model listens again, then speaks anew
    await append_units(client, quiet(UNIT_MS * (LISTEN_UNITS + SPEAK_UNITS + 2)))
    events = await client.recv_until("response.done", timeout=RESPONSE_TIMEOUT_S)
    stale = [e for e in events if e.get("response_id") == created["response_id"]]
    assert not stale
    assert events[-1]["response"]["status"] == "completed"


async def test_requests_of_a_turn_port_do_not_make_it_answer(server):
    """A commit is not the native model's cue (it listens on), and a
    response.create completes empty: the model speaks on its own schedule."""
    client, _ = await server.open()
    await client.send({"type": "input.text.append", "text": "hello"})
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("response.listen")
    assert events[-1]["reason"] == "model_listening"
    assert "response.created" not in types_of(events)
    await client.send({"type": "response.create"})
    events = await client.recv_until("response.done")
    done = events[-1]["response"]
    assert done["status"] == "completed"
    assert not [e for e in events if e["type"] == "response.output_audio.delta"]


async def test_a_failing_model_is_told_and_the_session_carries_on(server, monkeypatch):
    """A native model whose step raises: the client gets engine_error (an
    answer in progress ends failed), the session keeps serving, and the
    model is stepped no more."""
    from duplex_server.models import scripted

    steps = 0
    original = scripted.ScriptedSession.step

    async def failing(self, unit):
        nonlocal steps
        steps += 1
        if self.spoken:
            raise RuntimeError("model fell over")
        return await original(self, unit)

    monkeypatch.setattr(scripted.ScriptedSession, "step", failing)
    client, _ = await server.open()
    await append_units(client, quiet(UNIT_MS * (LISTEN_UNITS + 2)))
    events = await client.recv_until("response.done", timeout=RESPONSE_TIMEOUT_S)
    done = events[-1]["response"]
    assert (done["status"], done["duplex"]["reason"]) == ("failed", "engine_error")
    error = next(e for e in events if e["type"] == "error")
    assert (
        error["error"]["code"] == "engine_error" and "model fell over" in error["error"]["message"]
    )
    stepped = steps
    await append_units(client, quiet(UNIT_MS * 4))
    await client.send({"type": "session.heartbeat"})
    await client.recv_until("session.heartbeat_ack")
    assert steps == stepped


async def test_a_tool_call_reaches_the_client_as_openai_shapes_it(server, monkeypatch):
    """A native model's tool call: a function_call output item, its arguments
    events, and the item in response.done and in the conversation (every
    event checked against the openai SDK's models by the conformance fixture)."""
    from duplex_server.models import scripted
    from duplex_server.sessions.core.model_port import FunctionCallPart, UnitOutput

    original = scripted.ScriptedSession.step

    async def calling(self, unit):
        outputs = await original(self, unit)
        if self.spoken == 2:  # the second unit of the answer also calls a tool
            call = FunctionCallPart(call_id="call_7", name="lookup", arguments='{"q": "tide"}')
            outputs.append(UnitOutput(function_call=call))
        return outputs

    monkeypatch.setattr(scripted.ScriptedSession, "step", calling)
    client, _ = await server.open()
    await append_units(client, quiet(UNIT_MS * (LISTEN_UNITS + SPEAK_UNITS + 2)))
    events = await client.recv_until("response.done", timeout=RESPONSE_TIMEOUT_S)
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert (done["call_id"], done["name"], done["arguments"]) == (
        "call_7",
        "lookup",
        '{"q": "tide"}',
    )
    output = events[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["message", "function_call"]
    assert output[1]["call_id"] == "call_7" and events[-1]["response"]["status"] == "completed"


async def test_the_output_of_a_call_whose_answer_was_cut_off_is_stale(server, monkeypatch):
    """A call the model made in an answer that was then cancelled stands no
    more: its output is refused (stale_function_call_output), the session
    goes on, and the call item says incomplete."""
    from duplex_server.models import scripted
    from duplex_server.sessions.core.model_port import FunctionCallPart, UnitOutput

    original = scripted.ScriptedSession.step

    async def calling(self, unit):
        outputs = await original(self, unit)
        if self.spoken == 1:
            call = FunctionCallPart(call_id="call_9", name="lookup", arguments="{}")
            outputs.append(UnitOutput(function_call=call))
        return outputs

    monkeypatch.setattr(scripted.ScriptedSession, "step", calling)
    client, _ = await server.open()
    await append_units(client, quiet(UNIT_MS * (LISTEN_UNITS + 2)))
    await client.recv_until("response.function_call_arguments.done", timeout=RESPONSE_TIMEOUT_S)
    await client.send({"type": "response.cancel"})
    done = (await client.recv_until("response.done", timeout=RESPONSE_TIMEOUT_S))[-1]["response"]
    assert done["status"] == "cancelled"
    call = next(item for item in done["output"] if item["type"] == "function_call")
    assert call["status"] == "incomplete"
    output = {"type": "function_call_output", "call_id": "call_9", "output": "{}"}
    await client.send({"type": "conversation.item.create", "event_id": "late", "item": output})
    error = (await client.recv_until("error"))[-1]["error"]
    assert (error["code"], error["event_id"]) == ("stale_function_call_output", "late")
    await client.send({"type": "session.heartbeat"})
    await client.recv_until("session.heartbeat_ack")
