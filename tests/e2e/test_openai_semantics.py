"""OpenAI's session semantics on the OpenAI endpoint, and one dialect per socket.

Every event these tests receive is also checked against the openai SDK's
models by tests/openai_conformance.py (GA models on GA sockets, beta on beta).
"""

from __future__ import annotations

import asyncio

import pytest

from tests.speech import PHRASES, silence, speak
from tests.wsclient import WsClient, tone_pcm16, types_of

BETA_ONLY = {
    "response.audio.delta",
    "response.audio.done",
    "response.audio_transcript.delta",
    "response.audio_transcript.done",
    "response.text.delta",
    "response.text.done",
    "conversation.item.created",
}
GA_ONLY = {
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.delta",
    "response.output_audio_transcript.done",
    "response.output_text.delta",
    "response.output_text.done",
    "conversation.item.added",
    "conversation.item.done",
}


EXTENSIONS = {"response.speak", "response.listen", "turn.event", "overlap.decision"}


async def openai_socket(server, query: str = "", **kwargs) -> WsClient:
    """A stock OpenAI client's socket: plain ``/v1/realtime``, no ``duplex``."""
    client = await WsClient.connect(f"ws://{server.base}/v1/realtime{query}", **kwargs)
    await client.expect("session.created")
    return client


async def spoken_turn(client: WsClient) -> list[dict]:
    """A manual turn, as OpenAI defines it with no turn detection (echo has
    no VAD): the commit seals the input, response.create asks the answer."""
    await client.append(tone_pcm16(300))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    return await client.recv_until("response.done")


async def auto_turn(client: WsClient) -> list[dict]:
    """A turn on the duplex wire, whose commit starts the answer by itself."""
    await client.append(tone_pcm16(300))
    await client.send({"type": "input_audio_buffer.commit"})
    return await client.recv_until("response.done")


def assistant_part_types(events: list[dict]) -> set[str]:
    done = [e for e in events if e["type"] == "response.done"][-1]
    return {part["type"] for item in done["response"]["output"] for part in item["content"]}


async def test_a_ga_socket_gets_ga_names_only(server):
    client = await openai_socket(server)
    events = await spoken_turn(client)
    names = set(types_of(events))
    assert not names & BETA_ONLY
    assert not names & EXTENSIONS  # OpenAI's event types only on its endpoint
    assert {"conversation.item.added", "response.output_audio.delta"} <= names
    assert assistant_part_types(events) == {"output_audio"}
    # items always carry type and object (omit_defaults once dropped both)
    added = next(e for e in events if e["type"] == "conversation.item.added")
    assert (added["item"]["type"], added["item"]["object"]) == ("message", "realtime.item")
    await client.close()


@pytest.mark.parametrize("how", ["header", "query"])
async def test_a_beta_socket_gets_beta_names_only(server, how):
    if how == "header":
        client = await openai_socket(server, additional_headers={"OpenAI-Beta": "realtime=v1"})
    else:
        client = await openai_socket(server, "?events=beta")
    events = await spoken_turn(client)
    names = set(types_of(events))
    assert not names & GA_ONLY
    assert not names & EXTENSIONS
    assert {"conversation.item.created", "response.audio.delta"} <= names
    assert assistant_part_types(events) == {"audio"}
    await client.close()


async def test_response_create_with_no_input(server):
    """OpenAI answers it (agents greet this way); the duplex wire refuses it."""
    client = await openai_socket(server)
    await client.send({"type": "response.create", "event_id": "greet"})
    events = await client.recv_until("response.done")
    assert events[-1]["response"]["status"] == "completed"
    assert not [e for e in events if e["type"] == "error"]
    await client.close()

    duplex, _ = await server.open()
    await duplex.send({"type": "response.create", "event_id": "greet"})
    error = (await duplex.expect("error"))["error"]
    assert (error["code"], error["event_id"], error["param"]) == (
        "response_create_without_input",
        "greet",
        "type",
    )


async def test_nulls_for_optional_fields_are_not_given(server):
    client = await openai_socket(server)
    await client.send(
        {
            "type": "session.update",
            "session": {"instructions": None, "voice": None, "turn_detection": None},
        }
    )
    updated = await client.expect("session.updated")
    assert updated["session"]["instructions"] == "" and updated["session"]["turn_detection"] is None
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit", "response_create": False})
    await client.recv_until("conversation.item.done")
    await client.send(
        {"type": "response.create", "response": {"instructions": None, "metadata": None}}
    )
    events = await client.recv_until("response.done")
    assert events[-1]["response"]["status"] == "completed"
    assert not [e for e in events if e["type"] == "error"]
    await client.close()


async def test_metadata_is_the_clients_and_echoed(server):
    client, _ = await server.open()
    await client.send(
        {"type": "session.update", "session": {"extra_body": {"auto_response": False}}}
    )
    await client.expect("session.updated")
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.recv_until("conversation.item.done")
    await client.send({"type": "response.create", "response": {"metadata": {"req": "r1"}}})
    events = await client.recv_until("response.done")
    created = next(e for e in events if e["type"] == "response.created")
    assert created["response"]["metadata"] == {"req": "r1"}
    assert events[-1]["response"]["metadata"] == {"req": "r1"}
    duplex = events[-1]["response"]["duplex"]
    assert duplex["epoch"] == 0 and duplex["playback"]["generated_ms"] > 0


async def test_one_user_turn_gets_one_answer(server):
    """Commit (auto-response) then response.create, whatever arrives first."""
    client, _ = await server.open()
    # the auto-response is done before response.create arrives
    await auto_turn(client)
    await asyncio.sleep(0.3)
    await client.send({"type": "response.create", "event_id": "late"})
    await client.send({"type": "session.heartbeat"})
    events = await client.recv_until("session.heartbeat_ack")
    assert "response.created" not in types_of(events)
    # the auto-response is streaming when response.create (with metadata) arrives
    await client.send({"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 50}}})
    await client.expect("session.updated")
    await client.append(tone_pcm16(1000))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.recv_until("response.created")
    await client.send({"type": "response.create", "response": {"metadata": {"req": "r2"}}})
    events = await client.recv_until("response.done")
    assert types_of(events).count("response.created") == 0
    assert events[-1]["response"]["status"] == "completed"  # not cancelled by the create
    assert events[-1]["response"]["metadata"] == {"req": "r2"}
    # a second response.create for the same input is a new request: a new answer
    await client.send({"type": "response.create"})
    events = await client.recv_until("response.done")
    assert types_of(events).count("response.created") == 1


async def test_cancel_reasons_stay_in_openais_set(server):
    client, _ = await server.open()
    await client.send({"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 50}}})
    await client.expect("session.updated")
    await client.append(tone_pcm16(2000))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.recv_until("response.output_audio.delta")
    await client.send({"type": "barge_in"})
    events = await client.recv_until("response.done")
    response = events[-1]["response"]
    assert response["status"] == "cancelled"
    assert response["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    assert response["duplex"]["reason"] == "barge_in"


async def test_turn_detection_defaults_to_none_without_a_vad(server):
    """The echo model has no VAD: absent turn detection stays client commits."""
    client = await openai_socket(server)
    await client.send({"type": "session.update", "session": {"instructions": "hi"}})
    assert (await client.expect("session.updated"))["session"]["turn_detection"] is None
    await client.send(
        {
            "type": "session.update",
            "event_id": "sv",
            "session": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}},
        }
    )
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"], error["event_id"]) == (
        "unsupported_turn_detection",
        "session.turn_detection.type",
        "sv",
    )
    await client.send({"type": "session.heartbeat"})
    await client.expect("session.heartbeat_ack")  # the session keeps serving
    await client.close()


async def test_a_create_after_a_cut_or_finished_answer_is_never_swallowed(server):
    """Folding a response.create into the auto-response is for the one still
    streaming or completed; a retry after a cancelled one, or a create that
    wants its metadata echoed after the answer ended, gets its own answer."""
    client, _ = await server.open()
    await client.send({"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 50}}})
    await client.expect("session.updated")
    await client.append(tone_pcm16(1000))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.recv_until("response.created")
    await client.send({"type": "response.cancel"})
    assert (await client.recv_until("response.done"))[-1]["response"]["status"] == "cancelled"
    await client.send({"type": "response.create"})
    events = await client.recv_until("response.done")
    assert "response.created" in types_of(events)
    assert events[-1]["response"]["status"] == "completed"
    await client.send({"type": "response.create", "response": {"metadata": {"req": "again"}}})
    events = await client.recv_until("response.done")
    assert events[-1]["response"]["metadata"] == {"req": "again"}


async def test_response_overrides_in_the_ga_spelling(server):
    client, _ = await server.open()
    await client.append(tone_pcm16(200))
    await client.send({"type": "input_audio_buffer.commit", "response_create": False})
    await client.recv_until("conversation.item.done")
    assert (await client.expect("turn.event"))["event"] == "user_committed"
    refused = [
        ({"conversation": "none"}, "response.conversation"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "response.input"),
        # named as spelled, as session refusals are
        ({"audio": {"output": {"format": {"type": "audio/flac"}}}}, "response.audio.output.format"),
    ]
    for response, param in refused:
        await client.send({"type": "response.create", "event_id": "r", "response": response})
        error = (await client.expect("error"))["error"]
        assert (error["param"], error["event_id"]) == (param, "r"), error
    await client.send(
        {"type": "response.create", "response": {"audio": {"output": {"format": "g711_ulaw"}}}}
    )
    events = await client.recv_until("response.done")
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert deltas and {(d["format"], d["sample_rate_hz"]) for d in deltas} == {("g711_ulaw", 8000)}
    created = next(e for e in events if e["type"] == "response.created")["response"]
    assert created["output_audio_format"] == "g711_ulaw"  # the override, echoed


async def test_refusals_that_keep_every_echoed_item_valid(server):
    client, _ = await server.open()
    await client.send(
        {
            "type": "conversation.item.create",
            "event_id": "f",
            "item": {"type": "function_call", "call_id": "c1", "arguments": "{}"},
        }
    )
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_event", "item.name", "f")
    await client.send({"type": "session.update", "session": {"extra_body": {"chunk_delay_ms": 50}}})
    await client.expect("session.updated")
    await client.append(tone_pcm16(1000))
    await client.send({"type": "input_audio_buffer.commit"})
    created = (await client.recv_until("response.created"))[-1]["response"]
    item_id = created["output"][0]["id"]
    await client.send({"type": "conversation.item.delete", "item_id": item_id})
    error = (await client.recv_until("error"))[-1]["error"]
    assert (error["code"], error["param"]) == ("invalid_event", "item_id")
    await client.send({"type": "output_audio_buffer.clear"})
    events = await client.recv_until("output_audio_buffer.cleared")
    assert events[-1]["response_id"] == created["id"]
    await client.send({"type": "output_audio_buffer.clear"})  # nothing playing now
    cleared = (await client.recv_until("output_audio_buffer.cleared"))[-1]
    assert cleared["response_id"] == created["id"]  # the last one played


async def test_a_refused_first_session_update_keeps_the_socket(server):
    client = await WsClient.connect(f"ws://{server.base}/v1/realtime?autostart=0")
    await client.send(
        {"type": "session.update", "event_id": "bad", "session": {"input_audio_format": "mp3"}}
    )
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["event_id"]) == ("invalid_audio", "bad")
    assert error["param"] == "session.input_audio_format"
    await client.send({"type": "session.update", "event_id": "ok", "session": {}})
    assert (await client.expect("session.created"))["session"]["id"]
    await client.close()


async def test_manual_turns_commit_never_answers_and_create_echoes_metadata(server):
    """turn_detection null: a commit seals the input and starts nothing;
    response.create starts the answer, and response.created carries what the
    client asked (a client matches the two by metadata)."""
    client = await openai_socket(server)
    await client.send({"type": "session.update", "session": {"turn_detection": None}})
    await client.expect("session.updated")
    await client.append(tone_pcm16(300))
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "session.heartbeat"})
    events = await client.recv_until("session.heartbeat_ack")
    names = types_of(events)
    assert "input_audio_buffer.committed" in names and "response.created" not in names
    assert names.index("input_audio_buffer.committed") < names.index("conversation.item.added")
    asked = {
        "metadata": {"client_event_id": "turn-1"},
        "output_modalities": ["audio"],
        "conversation": "auto",
        "max_output_tokens": 300,
        "voice": "verse",
    }
    await client.send({"type": "response.create", "response": asked})
    events = await client.recv_until("response.done")
    assert types_of(events).count("response.created") == 1
    created = events[0]["response"]
    assert events[0]["type"] == "response.created"
    assert created["metadata"] == {"client_event_id": "turn-1"}
    assert created["output_modalities"] == ["audio"] and created["max_output_tokens"] == 300
    assert created["voice"] == "verse" and created["audio"]["output"]["voice"] == "verse"
    assert created["output_audio_format"] == "pcm16"
    assert created["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert created["conversation_id"]
    assert events[-1]["response"]["status"] == "completed"
    await client.close()


async def test_a_create_during_the_auto_answer_is_its_own_response(server):
    """On the OpenAI endpoint response.create is never folded into the
    auto-response: it is a response of its own (the duplex wire folds:
    test_one_user_turn_gets_one_answer)."""
    client = await openai_socket(server)
    settings = {"extra_body": {"chunk_delay_ms": 50, "auto_response": True}}
    await client.send({"type": "session.update", "session": settings})
    await client.expect("session.updated")
    await client.append(tone_pcm16(1000))
    await client.send({"type": "input_audio_buffer.commit", "response_create": True})
    first = (await client.recv_until("response.created"))[-1]["response"]["id"]
    await client.send({"type": "response.create", "response": {"metadata": {"req": "own"}}})
    events = await client.recv_until("response.created")
    second = events[-1]["response"]
    assert second["id"] != first and second["metadata"] == {"req": "own"}
    done = await client.recv_until("response.done")
    assert done[-1]["response"]["id"] == second["id"]
    await client.close()


async def test_extensions_only_where_asked(server):
    """?duplex_events=1 (or extra_body.duplex_events) gives a plain socket
    the extension events; the duplex wire has them anyway."""
    for query in ("?duplex_events=1", ""):
        client = await openai_socket(server, query)
        if not query:
            opt_in = {"extra_body": {"duplex_events": True}}
            await client.send({"type": "session.update", "session": opt_in})
            updated = await client.expect("session.updated")
            assert updated["session"]["extra_body"]["duplex_events"] is True
        names = set(types_of(await spoken_turn(client)))
        assert {"response.speak", "turn.event"} <= names, query
        await client.close()


async def test_cancel_with_nothing_active_is_openais_harmless_code(server):
    client = await openai_socket(server)
    await client.send({"type": "response.cancel", "event_id": "c1"})
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["event_id"]) == ("response_cancel_not_active", "c1")
    await client.send({"type": "response.cancel", "event_id": "c2", "response_id": "resp_nope"})
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"]) == ("response_not_found", "response_id")
    done = await spoken_turn(client)  # the session keeps serving
    finished = done[-1]["response"]["id"]
    await client.send({"type": "response.cancel", "response_id": finished})
    error = (await client.recv_until("error"))[-1]["error"]
    assert error["code"] == "response_cancel_not_active"
    await client.close()


async def test_an_agents_session_update_is_applied_whole(server):
    """The Agents SDK names OpenAI's model in every update: an alias of the
    served model, so nothing is refused. Another model is refused alone:
    the rest of the update applies, and the tools echo as sent."""
    client = await openai_socket(server)
    tool = {"type": "function", "name": "lookup", "description": "d", "parameters": {}}
    agents = {"type": "realtime", "model": "gpt-realtime-2.1", "instructions": "be kind"}
    await client.send({"type": "session.update", "session": {**agents, "tools": [tool]}})
    updated = (await client.expect("session.updated"))["session"]
    assert updated["instructions"] == "be kind" and updated["model"] == "echo"
    assert updated["tools"] == [tool]
    other = {"model": "whisper-large", "instructions": "be brief"}
    await client.send({"type": "session.update", "event_id": "u2", "session": other})
    error = (await client.expect("error"))["error"]
    assert (error["code"], error["param"], error["event_id"]) == (
        "model_update_unsupported",
        "session.model",
        "u2",
    )
    updated = (await client.expect("session.updated"))["session"]
    assert (updated["instructions"], updated["model"]) == ("be brief", "echo")
    await client.close()


async def test_playback_acks_tell_when_the_output_buffer_starts_and_stops(server):
    """The duplex wire knows what was played: the first ack of a response is
    output_audio_buffer.started, the ack that reaches the end of a finished
    one output_audio_buffer.stopped (OpenAI sends both where it plays)."""
    client, _ = await server.open()
    events = await auto_turn(client)
    done = events[-1]["response"]
    generated = done["duplex"]["playback"]["generated_ms"]
    assert generated > 0
    ack = {"type": "playback.ack", "response_id": done["id"]}
    await client.send({**ack, "played_ms": generated / 2})
    events = await client.recv_until("playback.acknowledged")
    assert types_of(events)[-2:] == ["output_audio_buffer.started", "playback.acknowledged"]
    assert events[-2]["response_id"] == done["id"]
    await client.send({**ack, "played_ms": generated})
    events = await client.recv_until("output_audio_buffer.stopped")
    assert types_of(events)[-2:] == ["playback.acknowledged", "output_audio_buffer.stopped"]
    await client.send({**ack, "played_ms": generated})  # nothing new: neither again
    events = await client.recv_until("playback.acknowledged")
    assert not {"output_audio_buffer.started", "output_audio_buffer.stopped"} & set(
        types_of(events)
    )


async def test_an_idle_user_is_prompted_after_the_timeout(voice_server):
    """Server VAD with idle_timeout_ms on the cascade: the user speaks, the
    answer comes, then only silence: once the answer has played and the
    timeout passed, timeout_triggered, and the silence is committed."""
    client = await openai_socket(voice_server)
    detection = {"type": "server_vad", "silence_duration_ms": 500, "idle_timeout_ms": 1500}
    update = {"turn_detection": detection, "input_audio_transcription": {"model": "whisper-1"}}
    await client.send({"type": "session.update", "session": update})
    assert (await client.expect("session.updated"))["session"]["turn_detection"][
        "idle_timeout_ms"
    ] == 1500
    chunk = 100  # ms a chunk, sent at the pace a microphone delivers them
    pcm = silence(300) + speak(PHRASES[1]) + silence(8000)
    step = 24_000 * chunk // 1000 * 2
    events: list[dict] = []
    reader = asyncio.create_task(_read_into(client, events))
    try:
        for at in range(0, len(pcm), step):
            await client.append(pcm[at : at + step])
            await asyncio.sleep(chunk / 1000)
            if "input_audio_buffer.timeout_triggered" in types_of(events):
                break
    finally:
        reader.cancel()
    names = types_of(events)
    assert "input_audio_buffer.timeout_triggered" in names, names
    answer = next(e for e in events if e["type"] == "response.done")["response"]
    played_ms = answer["duplex"]["playback"]["generated_ms"]
    triggered = next(e for e in events if e["type"] == "input_audio_buffer.timeout_triggered")
    assert triggered["audio_end_ms"] - triggered["audio_start_ms"] >= 1500
    # the silent stretch began no sooner than the answer could have played
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    assert triggered["audio_start_ms"] >= stopped["audio_end_ms"] + played_ms - chunk
    # then the silence is committed as the user's turn (cancelling recv is safe)
    after = names[names.index("input_audio_buffer.timeout_triggered") :]
    if "input_audio_buffer.committed" not in after:
        after += types_of(await client.recv_until("input_audio_buffer.committed"))
    assert after.index("input_audio_buffer.committed") < after.index("conversation.item.added")
    await client.close()


async def _read_into(client: WsClient, events: list[dict]) -> None:
    while True:
        events.append(await client.recv())
