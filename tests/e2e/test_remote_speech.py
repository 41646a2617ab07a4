"""``--asr-url`` / ``--tts-url``: the cascade's recogniser and voice on
other servers, here duplex-server's own batch routes (``POST
/v1/audio/transcriptions`` streamed, ``POST /v1/audio/speech`` as pcm) in
two more servers, one for each tier. A spoken question through the front
server is heard by the first remote's recogniser, and the parrot's answer
spoken by the second's voice (its audio recognised back); the stage
metrics are the local stages' own. A tier stopped: the turn fails as a
local stage's failure fails it (``engine_error``), ``/ready`` says which
tier (``asr_unreachable`` / ``tts_unreachable``), the session serves on,
and once the tier is back the same session is answered again."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from duplex_server.audio import resample_pcm16
from duplex_server.config import ServerConfig
from duplex_server.engine.audio.sphinx import Sphinx
from tests.conftest import RunningServer, free_port, running_server
from tests.e2e.test_voice import answer_pcm, first, silence, stream_paced, vad_session
from tests.speech import ANSWERS, PHRASES, speak

QUESTION = PHRASES[2]  # "good morning": heard whole by both recognisers
ANSWER = f"You said: {QUESTION}"  # in its words: Whisper punctuates what it hears


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


@dataclass
class Tiers:
    front: RunningServer
    asr: RunningServer  # its batch recogniser hears the front's turns
    tts: RunningServer  # its batch voice speaks the front's answers
    asr_stack: contextlib.AsyncExitStack  # what each remote runs in
    tts_stack: contextlib.AsyncExitStack
    http: httpx.AsyncClient

    async def stop(self, tier: str) -> None:
        await (self.asr_stack if tier == "asr" else self.tts_stack).aclose()

    async def start(self, tier: str) -> None:
        """The tier's server again, on the same port."""
        stack = contextlib.AsyncExitStack()
        port = (self.asr if tier == "asr" else self.tts).config.port
        server = await stack.enter_async_context(running_server(remote_config(port)))
        if tier == "asr":
            self.asr, self.asr_stack = server, stack
        else:
            self.tts, self.tts_stack = server, stack

    async def ready(self) -> httpx.Response:
        return await self.http.get(f"{self.front.http_url}/ready")

    async def stage_calls(self, stage: str) -> float:
        """``duplex_stage_seconds_count`` of ``stage``, from the front's /metrics
        (the series are the process's, the three servers' alike; the remotes'
        batch routes record theirs as ``asr_batch`` / ``tts_batch``)."""
        text = (await self.http.get(f"{self.front.http_url}/metrics")).text
        series = f'duplex_stage_seconds_count{{stage="{stage}"}} '
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series))


def remote_config(port: int) -> ServerConfig:
    """A plain cascade (Whisper on CTranslate2, eSpeak NG): its batch routes are the remote."""
    return ServerConfig(port=port, store="memory", model="cascade")


@pytest.fixture
async def tiers() -> AsyncIterator[Tiers]:
    asr_stack, tts_stack = contextlib.AsyncExitStack(), contextlib.AsyncExitStack()
    asr = await asr_stack.enter_async_context(running_server(remote_config(free_port())))
    tts = await tts_stack.enter_async_context(running_server(remote_config(free_port())))
    front_config = ServerConfig(
        port=free_port(),
        store="memory",
        model="cascade",
        asr_url=f"{asr.http_url}/v1",
        tts_url=f"{tts.http_url}/v1",
        speech_retries=0,
    )
    tiers = None
    try:
        async with running_server(front_config) as front, httpx.AsyncClient(timeout=30) as http:
            tiers = Tiers(front, asr, tts, asr_stack, tts_stack, http)
            yield tiers
            await front.assert_replay_determinism()
    finally:
        if tiers is not None:
            asr_stack, tts_stack = tiers.asr_stack, tiers.tts_stack
        await asr_stack.aclose()
        await tts_stack.aclose()


async def spoken_question(front: RunningServer) -> list[dict]:
    """The question spoken into a new server-VAD session, to its response's end."""
    client = await vad_session(front)
    try:
        return await asked(client)
    finally:
        await client.close()


async def asked(client) -> list[dict]:
    await stream_paced(client, silence(500) + speak(QUESTION) + silence(1200), chunk_ms=20)
    return await client.recv_until("response.done", timeout=60)


def heard_count(server: RunningServer) -> int:
    return server.app.state.batch.audio.transcriber.runs  # type: ignore[attr-defined]


def spoken_count(server: RunningServer) -> int:
    return server.app.state.batch.audio.speech.runs  # type: ignore[attr-defined]


async def test_a_spoken_question_is_heard_and_answered_by_the_remotes(tiers):
    assert (await tiers.ready()).status_code == 200
    asr_before, tts_before = await tiers.stage_calls("asr"), await tiers.stage_calls("tts")
    events = await spoken_question(tiers.front)
    heard = first(events, "conversation.item.input_audio_transcription.completed")
    assert words(heard["transcript"]) == QUESTION.split()
    assert events[-1]["response"]["status"] == "completed"
    assert words(first(events, "response.output_audio_transcript.done")["transcript"]) == words(
        ANSWER
    )
    # the first remote heard the turn, the second spoke the answer, clause by clause
    assert heard_count(tiers.asr) >= 1 and heard_count(tiers.tts) == 0
    assert spoken_count(tiers.tts) >= 1 and spoken_count(tiers.asr) == 0
    # the front's own stage series, as a local stage records them
    assert await tiers.stage_calls("asr") > asr_before
    assert await tiers.stage_calls("tts") > tts_before
    pcm = answer_pcm(events)
    # heard back by PocketSphinx listening for the parrot's answers (Whisper
    # tiny hears eSpeak's "You said:" alone as "You can")
    said = await asyncio.to_thread(Sphinx(ANSWERS).transcribe, resample_pcm16(pcm, 24_000, 16_000))
    assert said == f"you said {QUESTION}"


async def until_ready(tiers: Tiers) -> None:
    while (await tiers.ready()).status_code != 200:
        await asyncio.sleep(0.2)


async def test_the_voice_stopped_fails_the_answer_and_the_session_serves_on(tiers):
    client = await vad_session(tiers.front)
    try:
        await tiers.stop("tts")
        answer = await tiers.ready()
        assert answer.status_code == 503
        assert answer.json()["reasons"] == ["tts_unreachable"]
        events = await asked(client)
        # heard by the recogniser, still up; the answer's voice failed
        heard = first(events, "conversation.item.input_audio_transcription.completed")
        assert words(heard["transcript"]) == QUESTION.split()
        errors = [e["error"] for e in events if e["type"] == "error"]
        assert [error["code"] for error in errors] == ["engine_error"]
        assert "voice" in errors[0]["message"] and "does not answer" in errors[0]["message"]
        done = events[-1]["response"]
        assert (done["status"], done["duplex"]["reason"]) == ("failed", "engine_error")
        await tiers.start("tts")
        await until_ready(tiers)
        events = await asked(client)  # the same session, answered again
        assert events[-1]["response"]["status"] == "completed"
        assert words(first(events, "response.output_audio_transcript.done")["transcript"]) == words(
            ANSWER
        )
    finally:
        await client.close()


async def test_the_recogniser_stopped_fails_the_turn_and_the_session_serves_on(tiers):
    client = await vad_session(tiers.front)
    try:
        await tiers.stop("asr")
        answer = await tiers.ready()
        assert answer.status_code == 503
        assert answer.json()["reasons"] == ["asr_unreachable"]
        events = await asked(client)
        # the turn's words failed as a local recogniser's failure fails them:
        # engine_error, nothing heard, and the parrot asks again
        errors = [e["error"] for e in events if e["type"] == "error"]
        assert [error["code"] for error in errors] == ["engine_error"]
        assert "speech recogniser" in errors[0]["message"]
        assert "does not answer" in errors[0]["message"]
        heard = "conversation.item.input_audio_transcription.completed"
        assert not [e for e in events if e["type"] == heard]
        assert events[-1]["response"]["status"] == "completed"
        await tiers.start("asr")
        await until_ready(tiers)
        events = await asked(client)  # the same session hears and answers again
        assert words(first(events, heard)["transcript"]) == QUESTION.split()
        assert events[-1]["response"]["status"] == "completed"
        assert words(first(events, "response.output_audio_transcript.done")["transcript"]) == words(
            ANSWER
        )
    finally:
        await client.close()


async def test_with_both_tiers_stopped_ready_names_both(tiers):
    await tiers.stop("asr")
    await tiers.stop("tts")
    try:
        answer = await tiers.ready()
        assert answer.status_code == 503
        assert answer.json()["reasons"] == ["asr_unreachable", "tts_unreachable"]
    finally:
        await tiers.start("asr")
        await tiers.start("tts")
        await until_ready(tiers)
