"""A stock OpenAI Realtime client (the ``openai`` package), unmodified."""

from __future__ import annotations

import base64

from openai import AsyncOpenAI

from tests.wsclient import tone_pcm16


async def test_openai_sdk_holds_a_turn(server):
    client = AsyncOpenAI(api_key="unused", base_url=f"{server.http_url}/v1")
    async with client.realtime.connect(model="echo") as connection:
        created = await connection.recv()
        assert created.type == "session.created"
        await connection.session.update(
            session={"type": "realtime", "output_modalities": ["audio"]}
        )
        await connection.input_audio_buffer.append(audio=base64.b64encode(tone_pcm16(400)).decode())
        await connection.input_audio_buffer.commit()
        await connection.response.create()
        audio = b""
        transcript_events = 0
        async for event in connection:
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            elif event.type == "response.output_audio_transcript.delta":
                transcript_events += 1
            elif event.type == "error":
                raise AssertionError(event)
            elif event.type == "response.done":
                assert event.response.status == "completed"
                break
        assert len(audio) == len(tone_pcm16(400))
        assert transcript_events == 4
