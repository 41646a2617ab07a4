"""``--model moshi:PATH`` through the real server: a tiny random checkpoint
loads behind ``/ready``, and a session fed audio (no commit) gets the
model's own answer opened and streamed on the wire, unit by unit. (The
random model rarely falls quiet, so its turn need not end here; the whole
wire sequence of a conversation, with a checkpoint whose text is set by
hand, is tests/e2e/test_moshi_wire.py.)"""

from __future__ import annotations

import asyncio
import base64

import numpy as np

from duplex_bench.server_process import free_port
from duplex_bench.tiny_moshi import FRAME_SAMPLES, tiny_moshi
from duplex_server.config import ServerConfig
from tests.conftest import running_server
from tests.e2e.sequences import RESPONSE_OPEN
from tests.wsclient import types_of

UNITS = 8
LOAD_TIMEOUT_S = 120.0
ANSWER_TIMEOUT_S = 120.0


async def test_a_session_hears_the_model_answer_without_a_commit(tmp_path):
    checkpoint = tiny_moshi(tmp_path / "moshi")
    config = ServerConfig(
        port=free_port(), store="memory", model=f"moshi:{checkpoint}", moshi_rows=2
    )
    async with running_server(config) as server:
        service = server.manager.model.service  # type: ignore[attr-defined]
        try:
            assert await asyncio.to_thread(service.wait_loaded, LOAD_TIMEOUT_S), service.load_error
            client, created = await server.open()
            assert created["session"]["model"] == "moshi"
            noise = np.random.default_rng(5).standard_normal(UNITS * FRAME_SAMPLES) * 3000
            pcm = noise.astype("<i2").tobytes()
            for at in range(0, len(pcm), 2 * FRAME_SAMPLES):
                await client.append(pcm[at : at + 2 * FRAME_SAMPLES])
            events = await client.recv_until("response.speak", timeout=ANSWER_TIMEOUT_S)
            assert "input_audio_buffer.committed" not in types_of(events)
            opened = types_of(events)[types_of(events).index("response.created") :]
            assert opened == RESPONSE_OPEN
            audio = await client.recv_until("response.output_audio.delta", timeout=ANSWER_TIMEOUT_S)
            delta = base64.b64decode(audio[-1]["delta"])
            assert len(delta) == 2 * FRAME_SAMPLES  # one 80 ms frame of the model's voice
            await server.assert_replay_determinism()
        finally:
            service.close()
