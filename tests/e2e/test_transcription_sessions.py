"""OpenAI's realtime transcription sessions (issue 37, part 3), driven by the
stock ``openai`` SDK, unmodified: GA's ``session.type: "transcription"`` on
``?intent=transcription``, and the beta ``transcription_session.update``.

Audio in, turn detection and transcripts out, never a response. Every event
is also checked against the SDK's models by tests/openai_conformance.py; the
session objects are additionally built into the SDK's transcription session
models here, so a shape the union would let through as something else fails.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from openai import AsyncOpenAI
from openai.types.realtime import (
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ConversationItemInputAudioTranscriptionDeltaEvent,
    RealtimeTranscriptionSessionCreateRequest,
)
from openai.types.realtime.realtime_transcription_session_create_response import (
    RealtimeTranscriptionSessionCreateResponse,
)

from tests.e2e.test_whisper_default import whisper_server  # noqa: F401  # the fixture
from tests.speech import PHRASES, silence, speak
from tests.wsclient import WsClient

RATE = 24_000
CHUNK_MS = 20
TRANSCRIPTION = {"model": "gpt-4o-transcribe", "language": "en"}
GA_SESSION: dict[str, Any] = {
    "type": "transcription",
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": RATE},
            "transcription": TRANSCRIPTION,
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
            "noise_reduction": {"type": "near_field"},
        }
    },
    "include": ["item.input_audio_transcription.logprobs"],
}


def sdk_client(server) -> AsyncOpenAI:
    return AsyncOpenAI(
        api_key="unused",
        base_url=f"{server.http_url}/v1",
        websocket_base_url=f"ws://{server.base}/v1",
    )


async def say(connection, pcm: bytes) -> None:
    """``pcm`` in 20 ms appends at a microphone's pace."""
    loop = asyncio.get_running_loop()
    step = RATE * CHUNK_MS // 1000 * 2
    next_at = loop.time()
    for at in range(0, len(pcm), step):
        chunk = base64.b64encode(pcm[at : at + step]).decode()
        await connection.input_audio_buffer.append(audio=chunk)
        next_at += CHUNK_MS / 1000
        await asyncio.sleep(max(0.0, next_at - loop.time()))


async def events_until(connection, last: str) -> list[Any]:
    """The SDK's parsed events up to and including the first ``last``."""
    seen = []
    async for event in connection:
        seen.append(event)
        if event.type == last:
            return seen
    raise AssertionError(f"the socket closed before {last}: {[e.type for e in seen]}")


def assert_transcription_session(session: Any) -> dict[str, Any]:
    """The wire session object is an OpenAI transcription session, as the
    SDK's own models read it; returned as a dict."""
    wire = session.model_dump(exclude_unset=True) if hasattr(session, "model_dump") else session
    request = RealtimeTranscriptionSessionCreateRequest.model_validate(wire)
    RealtimeTranscriptionSessionCreateResponse.model_validate(wire)
    assert request.type == "transcription"
    assert wire["object"] == "realtime.transcription_session"
    return wire


def assert_one_transcribed_turn(seen: list[Any], phrase: str) -> str:
    """Speech heard, the turn committed, deltas adding up to the completed
    transcript (the phrase's words), the item done, and nothing a response
    would send."""
    kinds = [event.type for event in seen]
    assert not [kind for kind in kinds if kind.startswith("response.") or kind == "error"], kinds
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
    ]
    assert [kind for kind in kinds if kind in order] == order, kinds
    committed = next(e for e in seen if e.type == "input_audio_buffer.committed")
    completed = next(e for e in seen if e.type == order[3])
    deltas = [
        e.delta
        for e in seen
        if e.type == "conversation.item.input_audio_transcription.delta"
        and e.item_id == committed.item_id
    ]
    assert deltas, "a transcription session tells the transcript as it is heard"
    assert completed.item_id == committed.item_id
    assert "".join(deltas) == completed.transcript
    assert completed.transcript.lower().strip(" .") == phrase
    assert completed.usage.type == "duration"
    return str(committed.item_id)


async def test_a_ga_transcription_session_transcribes_and_never_answers(voice_server):
    """GA's flow: connect with ``intent=transcription``, configure with a
    ``session.update`` of type transcription, speak; the turn detection
    commits the turn and the transcript arrives in deltas that add up; a
    ``response.create`` is refused with a code and a param."""
    phrase = PHRASES[0]
    client = sdk_client(voice_server)
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        created = await connection.recv()
        assert created.type == "session.created"
        assert_transcription_session(created.session)
        await connection.session.update(session=GA_SESSION)  # type: ignore[arg-type]
        updated = await connection.recv()
        assert updated.type == "session.updated", updated
        session = assert_transcription_session(updated.session)
        assert session["audio"]["input"]["transcription"] == TRANSCRIPTION
        assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        assert session["include"] == GA_SESSION["include"]

        await say(connection, silence(300) + speak(phrase, RATE) + silence(1200))
        seen = await events_until(connection, "conversation.item.done")
        assert_one_transcribed_turn(seen, phrase)

        await connection.response.create(event_id="evt_ask")
        error = await connection.recv()
        assert error.type == "error", error
        assert (error.error.code, error.error.param, error.error.event_id) == (
            "unsupported_for_session_type",
            "type",
            "evt_ask",
        )
        assert error.error.type == "invalid_request_error"

        # The session's type is fixed now that it has heard something.
        await connection.session.update(session={"type": "realtime"})
        refused = await connection.recv()
        assert refused.type == "error"
        assert (refused.error.code, refused.error.param) == (
            "session_type_update_unsupported",
            "session.type",
        )
        assert_transcription_session((await connection.recv()).session)


async def test_a_first_update_of_type_transcription_makes_one(voice_server):
    """Without ``intent``, the session the socket opened at connect takes its
    first update's type while it has heard nothing (OpenAI would have opened
    it so); a commit then only transcribes."""
    client = sdk_client(voice_server)
    async with client.realtime.connect() as connection:
        assert (await connection.recv()).session.type == "realtime"
        await connection.session.update(session=GA_SESSION)  # type: ignore[arg-type]
        assert_transcription_session((await connection.recv()).session)
        await say(connection, silence(300) + speak(PHRASES[2], RATE) + silence(1200))
        seen = await events_until(connection, "conversation.item.done")
        assert_one_transcribed_turn(seen, PHRASES[2])


async def test_a_transcription_session_resumes_as_one(voice_server):
    """Logged like any session: resumed on a new socket it is still a
    transcription session, its transcript is in the replay, and it still
    refuses responses (the type is folded from the log)."""
    phrase = PHRASES[3]
    url = f"ws://{voice_server.base}/v1/realtime"
    client = await WsClient.connect(f"{url}?intent=transcription")
    created = await client.expect("session.created")
    assert_transcription_session(created["session"])
    await client.send({"type": "session.update", "session": GA_SESSION})
    await client.expect("session.updated")
    pcm = silence(300) + speak(phrase, RATE) + silence(1200)
    step = RATE * CHUNK_MS // 1000 * 2
    for at in range(0, len(pcm), step):
        await client.append(pcm[at : at + step])
    events = await client.recv_until("conversation.item.done")
    heard = events[-1]["item"]["content"][0]["transcript"]
    assert heard.lower().strip(" .") == phrase
    # The transcript events as the SDK's models build them from the JSON.
    deltas = [
        ConversationItemInputAudioTranscriptionDeltaEvent.model_validate(e).delta or ""
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.delta"
    ]
    (completed,) = [
        ConversationItemInputAudioTranscriptionCompletedEvent.model_validate(e)
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    assert "".join(deltas) == completed.transcript == heard
    await client.close()

    resumed = await WsClient.connect(f"{url}?autostart=0")
    await resumed.send(
        {
            "type": "session.resume",
            "session_id": created["session"]["id"],
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": 0,
        }
    )
    back = await resumed.expect("session.resumed")
    session = back["session"]
    assert session["type"] == "transcription"
    assert session["object"] == "realtime.transcription_session"
    assert session["audio"]["input"]["transcription"] == TRANSCRIPTION
    replay = await resumed.recv_until("conversation.item.done")
    replayed = [e for e in replay if e["type"].endswith("input_audio_transcription.completed")]
    assert [e["transcript"] for e in replayed] == [heard]
    await resumed.send({"type": "response.create", "event_id": "evt_after_resume"})
    error = await resumed.expect("error")
    assert (error["error"]["code"], error["error"]["param"]) == (
        "unsupported_for_session_type",
        "type",
    )
    await resumed.close()
    await voice_server.assert_replay_determinism()


async def test_a_commit_asking_for_a_response_is_refused(voice_server):
    """The commit's ``response_create`` extension asks for what a
    transcription session never does: refused with a code naming it."""
    client = await WsClient.connect(f"ws://{voice_server.base}/v1/realtime?intent=transcription")
    await client.expect("session.created")
    manual = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
    await client.send({"type": "session.update", "session": manual})
    await client.expect("session.updated")
    await client.append(speak(PHRASES[4], RATE))
    await client.send({"type": "input_audio_buffer.commit", "response_create": True})
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["param"]) == (
        "unsupported_for_session_type",
        "response_create",
    )
    # A plain commit is the client's turn: committed and transcribed.
    await client.send({"type": "input_audio_buffer.commit"})
    turn = await client.recv_until("conversation.item.done")
    assert "input_audio_buffer.committed" in [e["type"] for e in turn]
    assert not [e for e in turn if e["type"].startswith("response.")]
    await client.close()


async def test_an_unknown_intent_is_refused(voice_server):
    client = await WsClient.connect(f"ws://{voice_server.base}/v1/realtime?intent=poetry")
    error = await client.expect("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "intent")


async def test_a_beta_transcription_session(voice_server):
    """The beta client (``client.beta.realtime``, ``OpenAI-Beta: realtime=v1``)
    with ``intent=transcription`` configures with ``transcription_session.update``
    and is answered ``transcription_session.updated``; its speech is
    transcribed in beta's names, and nothing answers it."""
    phrase = PHRASES[1]
    client = sdk_client(voice_server)
    beta = client.beta.realtime.connect(model="cascade", extra_query={"intent": "transcription"})
    async with beta as connection:
        created = await connection.recv()
        assert created.type == "session.created"
        await connection.transcription_session.update(
            session={
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                "input_audio_noise_reduction": {"type": "near_field"},
            },
            event_id="evt_configure",
        )
        updated = await connection.recv()
        assert updated.type == "transcription_session.updated", updated
        session = updated.session
        assert session.input_audio_format == "pcm16"
        assert session.input_audio_transcription.model == "gpt-4o-transcribe"
        assert session.turn_detection.type == "server_vad"
        assert session.model_extra["object"] == "realtime.transcription_session"

        await say(connection, silence(300) + speak(phrase, RATE) + silence(1200))
        seen = await events_until(
            connection, "conversation.item.input_audio_transcription.completed"
        )
        kinds = [event.type for event in seen]
        assert "input_audio_buffer.committed" in kinds
        assert "conversation.item.created" in kinds
        assert not [kind for kind in kinds if kind.startswith("response.") or kind == "error"]
        deltas = [e.delta for e in seen if e.type.endswith("input_audio_transcription.delta")]
        assert "".join(deltas) == seen[-1].transcript
        assert seen[-1].transcript.lower().strip(" .") == phrase

        await connection.response.create()
        error = await connection.recv()
        assert error.type == "error"
        assert (error.error.code, error.error.param) == ("unsupported_for_session_type", "type")


async def test_a_transcription_session_on_the_duplex_wire_tells_deltas_that_add_up(
    whisper_server,  # noqa: F811  # the fixture, imported
):
    """On ``?duplex=1`` an ordinary session's partials are live captions the
    final replaces; a transcription session's transcript is its product, so
    there too its deltas only ever extend what was told and add up to the
    completed transcript (the commit's closing delta tells the rest)."""
    phrase = "can you recommend a good book to read on a long train journey"
    client, created = await whisper_server.open("intent=transcription")
    assert created["session"]["type"] == "transcription"
    await client.send({"type": "session.update", "session": GA_SESSION})
    await client.expect("session.updated")
    pcm = silence(300) + speak(phrase, RATE) + silence(1200)
    step = RATE * CHUNK_MS // 1000 * 2
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    for at in range(0, len(pcm), step):  # paced: partials are decoded while it is spoken
        await client.append(pcm[at : at + step])
        next_at += CHUNK_MS / 1000
        await asyncio.sleep(max(0.0, next_at - loop.time()))
    events = await client.recv_until("conversation.item.done", timeout=30)
    kinds = [e["type"] for e in events]
    assert not [kind for kind in kinds if kind.startswith("response.") or kind == "error"], kinds
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    deltas = [
        e
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.delta"
        and e["item_id"] == committed["item_id"]
    ]
    (completed,) = [
        e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    # Whisper's partials of an open sentence run short of its final (and its
    # punctuation): captions told as deltas would not add up (they did before).
    assert deltas and completed["transcript"]
    assert "".join(e["delta"] for e in deltas) == completed["transcript"]
    await client.close()
