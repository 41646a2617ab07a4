"""The voice page at ``GET /`` in a real headless Chromium: a spoken question
from a WAV file as the microphone, an answer heard and acknowledged."""

from __future__ import annotations

import shutil
import wave

import pytest
from playwright.async_api import async_playwright

from duplex_server.sessions.core.records import AckBody, CommitBody, DecisionBody, OutBody
from protocol.dialect import Dialect, present
from tests.openai_conformance import check_event
from tests.speech import PHRASES, silence, speak

CHROMIUM = shutil.which("chromium")
RATE = 48_000
# Flags for a closed network and no screen (see the machine notes).
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]


def question_wav(path, phrase: str) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(silence(1500, RATE) + speak(phrase, RATE) + silence(6000, RATE))


async def test_voice_page_hears_a_question_and_plays_the_answer(voice_server, tmp_path):
    assert CHROMIUM, "chromium is not installed (make test installs the Debian package)"
    wav = tmp_path / "question.wav"
    question_wav(wav, PHRASES[0])
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}%noloop"],
        )
        try:
            page = await browser.new_page()
            await page.goto(voice_server.http_url + "/")
            assert await page.title() == "duplex-server: talk"
            await page.click("#start")
            await page.wait_for_function(
                "window.duplexState.assistantTranscripts.length > 0"
                " && window.duplexState.playedMs >= 1000 && window.duplexState.acks > 0",
                timeout=30_000,
            )
            state = await page.evaluate("window.duplexState")
            log_text = await page.inner_text("#log")
        finally:
            await browser.close()
    assert state["errors"] == []
    assert state["userTranscripts"] == [PHRASES[0]]
    assert state["assistantTranscripts"] == [f"You said: {PHRASES[0]}."]
    assert f"You: {PHRASES[0]}" in log_text and "Assistant: You said" in log_text
    # The server's side: the turn and the answer, its history as far as the page played it.
    (actor,) = voice_server.manager.actors.values()
    user, assistant = actor.state.items[:2]
    assert user.role == "user" and user.parts[0].transcript == PHRASES[0]
    assert assistant.role == "assistant" and assistant.history_ms >= 1000
    # ... and in its log: the VAD's decisions, the transcript, the page's acks.
    records = await voice_server.app.state.log.read(actor.session_id)
    actions = [r.body.action for r in records if isinstance(r.body, DecisionBody)]
    assert "speech_started" in actions and "speech_stopped" in actions
    commits = [r.body for r in records if isinstance(r.body, CommitBody)]
    assert commits[0].transcript == PHRASES[0]
    acks = [r.body for r in records if isinstance(r.body, AckBody) and r.body.what == "playback"]
    assert acks and max(a.played_ms for a in acks) >= 1000
    # What the page received (a GA socket) held to the openai SDK's models too;
    # the page is not a websockets client, so its events are checked from the log.
    sent = [
        present(r.body.payload, Dialect.GA)
        for r in records
        if isinstance(r.body, OutBody) and r.body.payload
    ]
    checked = [check_event(p.decode(), "ga") for p in sent if p is not None]
    assert len(checked) > 20 and [v for v in checked if v is not None] == []


KEY = "page-" + "k" * 27


@pytest.mark.server_config(api_key=KEY)
async def test_voice_page_trades_its_key_for_a_client_secret(voice_server, tmp_path):
    """On a server with keys the page mints a client secret with the key its
    user typed and opens its socket with that: the key itself never rides in
    a WebSocket subprotocol. Without a key it is refused."""
    wav = tmp_path / "quiet.wav"
    with wave.open(str(wav), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(silence(3000, RATE))
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}%noloop"],
        )
        ephemeral = voice_server.app.state.ephemeral
        taken = []
        take = ephemeral.take
        ephemeral.take = lambda key: taken.append(take(key)) or taken[-1]
        try:
            page = await browser.new_page()
            await page.goto(voice_server.http_url + "/")
            await page.click("#start")  # no key: the socket is refused
            await page.wait_for_function("window.duplexState.status === 'disconnected'")
            await page.click("#stop")
            await page.fill("#key", KEY)
            await page.click("#start")
            await page.wait_for_function("window.duplexState.status === 'listening'")
            state = await page.evaluate("window.duplexState")
        finally:
            await browser.close()
    assert state["errors"] == []
    (actor,) = voice_server.manager.actors.values()
    assert actor.state.owner == "default"  # the key's principal, through the secret
    assert len(taken) == 1 and taken[0] is not None  # the socket presented a secret, once
