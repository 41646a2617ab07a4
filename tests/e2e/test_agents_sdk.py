"""The OpenAI Agents SDK's realtime agents (``openai-agents`` 0.24), unmodified:
its own ``RealtimeRunner`` and websocket model, pointed at the server as a
user points it at any OpenAI-compatible endpoint (``model_config["url"]``).

The SDK names its own model in every ``session.update`` (``gpt-realtime-2.1``),
asks for ``semantic_vad`` and transcription, and parses every server event with
the openai SDK's models: an event type it does not know, or any ``error``, is
an ``error`` event in the agent's session stream. So each test also asserts
that the stream held no error at all, and that the agent ran as configured
(its instructions, voice and tools in ``session.updated``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession

from duplex_bench.tiny_llm import FOLLOW_UP, QUESTION, WEATHER, trained_tool_model
from tests.conftest import serving_llm
from tests.speech import PHRASES, silence, speak

RATE = 24_000  # the SDK's default pcm16 rate
CHUNK_MS = 20
INSTRUCTIONS = "You answer in one short sentence."
VOICE = "alloy"
WAIT_S = 30.0  # generous: the cascade runs on CPU, shared with the test


@dataclass
class AgentRun:
    """An agent's session, with every session event it produced and every
    server event it received, collected while the test drives it."""

    session: RealtimeSession
    events: list[Any] = field(default_factory=list)
    server_events: list[dict[str, Any]] = field(default_factory=list)

    async def collect(self) -> None:
        async for event in self.session:
            self.events.append(event)
            data = getattr(event, "data", None)
            if event.type == "raw_model_event" and data.type == "raw_server_event":
                self.server_events.append(data.data)

    def of(self, kind: str) -> list[Any]:
        return [event for event in self.events if event.type == kind]

    def received(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.server_events if event["type"] == kind]

    async def until(self, what: str, condition: Callable[[], object]) -> None:
        """Wait for ``condition``; a timeout fails saying what was waited for."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while not condition() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert condition(), f"timed out waiting for {what}; {self.summary()}"

    def summary(self) -> str:
        told = [e["type"] for e in self.server_events if not e["type"].endswith(".delta")]
        seen = [e.type for e in self.events if e.type not in ("raw_model_event", "audio")]
        return f"server events (deltas left out): {told}; session events: {seen}"

    async def say(self, pcm: bytes) -> None:
        """``pcm`` in 20 ms appends at the pace a microphone delivers them."""
        loop = asyncio.get_running_loop()
        step = RATE * CHUNK_MS // 1000 * 2
        next_at = loop.time()
        for at in range(0, len(pcm), step):
            await self.session.send_audio(pcm[at : at + step])
            next_at += CHUNK_MS / 1000
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def answers(self) -> list[dict[str, Any]]:
        return [event["response"] for event in self.received("response.done")]

    def assert_clean(self) -> None:
        """No ``error`` in the agent's stream: none the server sent, none the
        SDK raised for an event it could not parse."""
        errors = [getattr(event, "error", event) for event in self.of("error")]
        assert not errors, f"the agent's session saw errors: {errors}"

    def assert_configured(self, tools: list[str], instructions: str = INSTRUCTIONS) -> None:
        """The last ``session.updated`` holds what the agent configured."""
        session = self.received("session.updated")[-1]["session"]
        assert session["instructions"] == instructions
        assert session["audio"]["output"]["voice"] == VOICE
        assert session["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
        assert session["audio"]["input"]["turn_detection"]["interrupt_response"] is True
        assert session["audio"]["input"]["transcription"]["model"] == "gpt-4o-mini-transcribe"
        assert [tool["name"] for tool in session["tools"]] == tools
        assert all(tool["type"] == "function" for tool in session["tools"])


@dataclass
class Agent:
    """Runs one agent against ``url`` for a test's script."""

    url: str
    tools: list[Any] = field(default_factory=list)
    instructions: str | None = INSTRUCTIONS

    async def run(self, script: Callable[[AgentRun], Any]) -> AgentRun:
        agent = RealtimeAgent(name="assistant", instructions=self.instructions, tools=self.tools)
        runner = RealtimeRunner(agent, config={"model_settings": {"voice": VOICE}})
        session = await runner.run(model_config={"url": self.url, "api_key": "unused"})
        async with session:
            run = AgentRun(session)
            collector = asyncio.create_task(run.collect())
            try:
                await run.until(
                    "the agent's session.updated", lambda: run.received("session.updated")
                )
                await script(run)
            finally:
                collector.cancel()
        return run


@pytest.fixture
def sdk_errors(caplog) -> Callable[[], list[str]]:
    """The SDK's own ERROR log lines (it logs an event it cannot validate)."""
    caplog.set_level(logging.ERROR, logger="openai.agents")
    return lambda: [r.getMessage() for r in caplog.records if r.name.startswith("openai.agents")]


def realtime_url(server) -> str:
    return f"ws://{server.base}/v1/realtime"


async def test_a_text_turn_runs_the_agent_as_configured(voice_server, sdk_errors):
    phrase = PHRASES[1]

    async def script(run: AgentRun) -> None:
        await run.session.send_message(phrase)
        await run.until("the answer's agent_end", lambda: run.of("agent_end"))

    run = await Agent(realtime_url(voice_server)).run(script)
    run.assert_clean()
    assert not sdk_errors()
    run.assert_configured(tools=[])
    (answer,) = run.answers()
    assert answer["status"] == "completed"
    assert answer["output"][0]["content"][0]["transcript"] == f"You said: {phrase}."
    assert run.of("audio"), "no answer audio reached the agent"


async def test_a_spoken_turn_under_its_default_turn_detection(voice_server, sdk_errors):
    """semantic_vad (the SDK's default) is served by the server's VAD: the
    speech ends the turn, the server answers it, and the user's words come
    back as transcription deltas that add up to the completed transcript."""
    phrase = PHRASES[0]

    async def script(run: AgentRun) -> None:
        await run.say(silence(500) + speak(phrase, RATE) + silence(1500))
        await run.until("the answer's agent_end", lambda: run.of("agent_end"))

    run = await Agent(realtime_url(voice_server)).run(script)
    run.assert_clean()
    assert not sdk_errors()
    (completed,) = run.received("conversation.item.input_audio_transcription.completed")
    assert completed["transcript"] == phrase
    deltas = run.received("conversation.item.input_audio_transcription.delta")
    assert "".join(delta["delta"] for delta in deltas) == phrase
    order = [
        event["type"]
        for event in run.server_events
        if event["type"]
        in (
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.added",
            "conversation.item.input_audio_transcription.completed",
        )
    ]
    assert order[:5] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.input_audio_transcription.completed",
    ]
    assert [answer["status"] for answer in run.answers()] == ["completed"]
    # the SDK's history (its last history_updated) holds the user's words
    history = run.of("history_updated")[-1].history
    users = [item.model_dump_json() for item in history if getattr(item, "role", None) == "user"]
    assert any(phrase in item for item in users), users


async def test_speech_over_the_answer_interrupts_it(voice_server, sdk_errors):
    """Barge-in: the SDK hears speech_started during the answer, emits
    audio_interrupted and truncates the item to what it played; the server
    cancelled the answer the OpenAI way, and the new utterance is answered."""
    first, second = PHRASES[0], PHRASES[2]

    async def script(run: AgentRun) -> None:
        await run.say(silence(500) + speak(first, RATE) + silence(900))
        await run.until("the first answer's audio", lambda: run.of("audio"))
        await run.say(speak(second, RATE) + silence(1500))

        def second_answered() -> bool:
            answers = run.answers()
            return len(answers) >= 2 and answers[-1]["status"] == "completed"

        await run.until("the answer to the second utterance", second_answered)

    run = await Agent(realtime_url(voice_server)).run(script)
    run.assert_clean()
    assert not sdk_errors()
    assert run.of("audio_interrupted"), "the SDK never heard the interruption"
    statuses = [answer["status"] for answer in run.answers()]
    assert statuses == ["cancelled", "completed"], statuses
    assert run.answers()[0]["status_details"]["reason"] == "turn_detected"
    (truncated,) = run.received("conversation.item.truncated")
    assert truncated["item_id"] == run.answers()[0]["output"][0]["id"]
    assert run.answers()[-1]["output"][0]["content"][0]["transcript"] == f"You said: {second}."


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return WEATHER


@pytest.fixture
async def tool_server(tmp_path_factory):
    """The cascade answering with the tiny tool-calling chat model."""
    path = trained_tool_model(tmp_path_factory.getbasetemp())
    async with serving_llm("--llm", str(path), "--llm-max-new-tokens", "120") as running:
        yield running


async def test_a_function_tool_round_trip(tool_server, sdk_errors):
    """The model calls get_weather; the SDK runs the agent's tool once (on
    the completed item), sends its output and asks for the follow-up, which
    uses the output."""

    async def script(run: AgentRun) -> None:
        await run.session.send_message(QUESTION)
        await run.until("the follow-up answer", lambda: len(run.of("agent_end")) >= 2)

    # No instructions: the tiny model was trained on the bare question.
    agent = Agent(realtime_url(tool_server), tools=[get_weather], instructions=None)
    run = await agent.run(script)
    run.assert_clean()
    assert not sdk_errors()
    run.assert_configured(tools=["get_weather"], instructions="")
    assert len(run.of("tool_start")) == len(run.of("tool_end")) == 1
    assert run.of("tool_end")[0].output == WEATHER
    added = [
        event["item"]
        for event in run.received("response.output_item.added")
        if event["item"]["type"] == "function_call"
    ]
    assert [(item["status"], item["arguments"]) for item in added] == [("in_progress", "")]
    follow_up = run.answers()[-1]["output"][0]["content"][0]["transcript"]
    assert follow_up == FOLLOW_UP
