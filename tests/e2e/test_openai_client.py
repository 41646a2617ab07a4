"""A stock OpenAI Realtime client (the ``openai`` package), unmodified."""

from __future__ import annotations

import base64

from openai import AsyncOpenAI

from tests.wsclient import tone_pcm16


async def ask_with_a_tone(connection) -> tuple[list[str], bytes]:
    """Send 400 ms of tone, commit, ask; the event types up to response.done
    and the answer's audio, read by the SDK's own models."""
    await connection.input_audio_buffer.append(audio=base64.b64encode(tone_pcm16(400)).decode())
    await connection.input_audio_buffer.commit()
    await connection.response.create()
    kinds, audio = [], b""
    async for event in connection:
        kinds.append(event.type)
        if event.type in ("response.output_audio.delta", "response.audio.delta"):
            audio += base64.b64decode(event.delta)
        elif event.type == "error":
            raise AssertionError(event)
        elif event.type == "response.done":
            assert event.response.status == "completed"
            break
    return kinds, audio


async def test_openai_sdk_holds_a_turn(server):
    client = AsyncOpenAI(api_key="unused", base_url=f"{server.http_url}/v1")
    async with client.realtime.connect(model="echo") as connection:
        created = await connection.recv()
        assert created.type == "session.created"
        await connection.session.update(
            session={"type": "realtime", "output_modalities": ["audio"]}
        )
        kinds, audio = await ask_with_a_tone(connection)
        assert len(audio) == len(tone_pcm16(400))
        assert kinds.count("response.output_audio_transcript.delta") == 4


async def test_openai_beta_sdk_gets_one_frame_per_kind(server):
    """The beta client (``client.beta.realtime``, which sends ``OpenAI-Beta:
    realtime=v1``) gets beta names and no GA twins: two frames per chunk
    (audio and its transcript), not four (issue 17, part 2)."""
    client = AsyncOpenAI(
        api_key="unused",
        base_url=f"{server.http_url}/v1",
        websocket_base_url=f"ws://{server.base}/v1",  # the beta client assumes wss
    )
    async with client.beta.realtime.connect(model="echo") as connection:
        assert (await connection.recv()).type == "session.created"
        await connection.session.update(session={"modalities": ["audio", "text"]})
        kinds, audio = await ask_with_a_tone(connection)
        assert len(audio) == len(tone_pcm16(400))
        assert kinds.count("response.audio.delta") == kinds.count("response.audio_transcript.delta")
        ga_only = ("response.output_audio", "response.output_text", "conversation.item.added")
        assert not [kind for kind in kinds if kind.startswith(ga_only)]
