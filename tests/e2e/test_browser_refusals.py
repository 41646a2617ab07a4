"""The voice page when something is wrong: a microphone the browser refuses,
a server with keys and a missing or wrong key, and a model that cannot hold
a spoken conversation. Each is said on the page in words a person can act
on, and the page stays usable (Start works again)."""

from __future__ import annotations

import json
import urllib.request

from tests.e2e.voicepage import VoicePage, chromium, log_lines, quiet, voice_server, write_wav

KEY = "page-" + "k" * 27


def health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=10) as response:
        return json.loads(response.read())


async def test_a_refused_microphone_is_said_and_no_session_is_opened(tmp_path):
    with voice_server(tmp_path) as server:
        async with chromium(allow_microphone=False) as browser:
            page = await VoicePage.open(browser, server.http_url)
            await page.start()
            alert = await page.wait_text("#alert", "refused the microphone")
            state = await page.state()
            start_enabled = await page.page.is_enabled("#start")
        sessions = health(server.http_url)["sessions"]
    assert "Allow microphone access" in alert
    assert state == "ended" and start_enabled
    assert sessions == 0  # nothing was opened for a call that could not hear


async def test_a_missing_or_wrong_key_is_said_and_the_right_one_opens_with_a_secret(tmp_path):
    """On a server with keys the page trades the key its user typed for a
    client secret and opens its socket with that: the key itself never rides
    in a WebSocket subprotocol. A missing or wrong key is refused in words."""
    wav = write_wav(tmp_path / "quiet.wav", quiet(3000))
    with voice_server(tmp_path, api_key=KEY) as server:
        async with chromium(wav) as browser:
            page = await VoicePage.open(browser, server.http_url)
            offered = await page.subprotocols_offered()
            await page.start()
            missing = await page.wait_text("#alert", "needs an API key")
            await page.start(key="page-wrong-key-" + "x" * 20)
            wrong = await page.wait_text("#alert", "refused this API key")
            await page.start(key=KEY)
            session_id = await page.session_id()
            await page.wait_state("listening")
            assert await page.text("#alert") == ""
        lines = log_lines(server, session_id, key=KEY)
    assert "Enter it above" in missing and "Check the key" in wrong
    # One socket, opened with a client secret, never with the key.
    (protocols,) = offered
    assert protocols.startswith("realtime, openai-insecure-api-key.ek_")
    assert KEY not in protocols
    opening = next(line["body"] for line in lines if line["kind"] == "config")
    assert opening["owner"] == "default"  # the key's principal, through the secret


async def test_a_model_that_cannot_hold_a_spoken_conversation_is_said_before_start(tmp_path):
    # echo repeats what it is sent once the client commits: it does not
    # listen for speech, so this hands-free page cannot take turns with it.
    with voice_server(tmp_path, model="echo") as server:
        async with chromium() as browser:
            page = await VoicePage.open(browser, server.http_url)
            alert = await page.wait_text("#alert", "cannot hold a spoken conversation")
            chips = await page.text("#capabilities")
            start_enabled = await page.page.is_enabled("#start")
    assert "“echo”" in alert and "does not listen for speech" in alert
    assert "--model cascade" in alert
    assert "no hears when you stop" in chips
    assert not start_enabled
