from tests.wsclient import tone_pcm16, types_of


async def test_commit_gets_a_full_response(server):
    client, created = await server.open()
    assert created["session"]["capabilities"]["supports_barge_in"] is True
    await client.append(tone_pcm16(300))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("rate_limits.updated")
    assert "response.done" in types_of(events)
    await client.close()
