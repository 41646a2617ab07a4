"""The voice page over WebRTC, its default where the server offers it, in a
real headless Chromium against a real server process: the spoken question
(a WAV file as the microphone) leaves on the page's Opus track, the answer
comes back on the server's track and its words are shown; the events ride
the ``oai-events`` data channel, in OpenAI's dialect. And a page that cannot
use WebRTC falls back to the WebSocket by itself, says so, and still works."""

from __future__ import annotations

import json
import re

from tests.e2e.voicepage import (
    VoicePage,
    chromium,
    log_lines,
    quiet,
    said,
    start_voice_server,
    voice_server,
    write_wav,
)
from tests.openai_conformance import check_event
from tests.speech import PHRASES

DESKTOP = {"width": 900, "height": 760}
ANSWER = f"You said: {PHRASES[0]}."
# The page's peer connections, and every message their data channels
# receive, kept for the test to read.
WATCH_CHANNELS = """
window.peers = [];
window.channelFrames = [];
const createDataChannel = RTCPeerConnection.prototype.createDataChannel;
RTCPeerConnection.prototype.createDataChannel = function (...args) {
  window.peers.push(this);
  const channel = createDataChannel.apply(this, args);
  channel.addEventListener("message", (message) => window.channelFrames.push(message.data));
  return channel;
};
"""
# What the browser played of the server's track (WebRTC's inbound-rtp stats:
# the energy and length of the audio its playout took from the jitter buffer).
PLAYED_STATS = """async () => {
  const stats = await window.peers.at(-1).getStats();
  const inbound = [...stats.values()].find((s) => s.type === "inbound-rtp" && s.kind === "audio");
  return { energy: inbound.totalAudioEnergy, seconds: inbound.totalSamplesDuration };
}"""
NO_WEBRTC = "delete window.RTCPeerConnection; delete window.webkitRTCPeerConnection;"


def question_wav(tmp_path):
    # The lead-in silence covers the call's setup (ICE and DTLS take longer
    # than a socket): the microphone file plays from when it is opened.
    return write_wav(tmp_path / "question.wav", quiet(2500), said(PHRASES[0]), quiet(6000))


async def test_a_spoken_question_is_answered_over_webrtc_by_default(tmp_path):
    with voice_server(tmp_path) as server:
        async with chromium(question_wav(tmp_path)) as browser:
            page = await VoicePage.open(
                browser, server.http_url, transport=None, init_script=WATCH_CHANNELS
            )
            socket_frames = page.frames_received()
            await page.start()
            session_id = await page.session_id()
            assert await page.text("#transport-used") == "WebRTC"
            await page.wait_text("#conversation", ANSWER)
            await page.wait_state("listening")  # the answer has played out
            assert await page.turns("user") == [PHRASES[0]]
            assert await page.turns("assistant") == [ANSWER]
            partials = await page.partials_seen()
            assert partials[0] == "…" and f"{PHRASES[0]}…" in partials
            latency = await page.text("#conversation .turn.assistant .latency")
            assert re.fullmatch(r"\d+\.\d\d s to first audio", latency), latency
            seen = await page.states_seen()
            assert await page.text("#alert") == ""
            channel_frames = await page.page.evaluate("window.channelFrames")
            playout = await page.page.evaluate(PLAYED_STATS)
            lines = log_lines(server, session_id)
            # Stop ends the session (session.close on the channel), then the call.
            await page.page.click("#stop")
            await page.wait_text("#notice", "Call ended.")
            await page.page.wait_for_function(
                "([url]) => fetch(url).then((r) => r.json()).then((s) => s.state === 'closed')",
                arg=[f"{server.http_url}/v1/sessions/{session_id}"],
                timeout=10_000,
            )
    assert [s for s in seen if s in ("hearing you", "thinking", "speaking")] == [
        "hearing you",
        "thinking",
        "speaking",
    ]
    assert seen[-1] == "listening"
    # Nothing went over a WebSocket; the channel carried OpenAI's events only
    # (no audio deltas: the answer was on the track).
    assert socket_frames == []
    types = [json.loads(frame)["type"] for frame in channel_frames]
    assert types[0] == "session.created" and "response.output_audio.delta" not in types
    assert "output_audio_buffer.started" in types
    checked = [check_event(frame, "ga", extensions=False) for frame in channel_frames]
    assert [v for v in checked if v is not None] == []
    # The session was the call's; what the page heard was acknowledged by the
    # server from its track, to the answer's end, and the page sent no acks.
    opening = next(line["body"] for line in lines if line["kind"] == "config")
    assert opening["patch"]["input_audio_transcription"] is not None
    answer_ms = sum(
        line["body"]["audio_ms"]
        for line in lines
        if line["kind"] == "out" and line["body"]["audio_ms"] > 0
    )
    played = [
        line["body"]["played_ms"]
        for line in lines
        if line["kind"] == "ack" and line["body"]["what"] == "playback"
    ]
    assert played and abs(played[-1] - answer_ms) < 30, (played, answer_ms)
    # The browser played the answer's sound from the track (the server sends
    # silence between answers: about zero energy).
    assert playout["energy"] > 0.01 and playout["seconds"] > answer_ms / 1000, playout
    heard = [line["body"]["transcript"] for line in lines if line["kind"] == "commit"]
    assert heard == [PHRASES[0]]


async def test_a_browser_without_webrtc_falls_back_to_the_websocket(tmp_path):
    with voice_server(tmp_path) as server:
        async with chromium(question_wav(tmp_path)) as browser:
            page = await VoicePage.open(
                browser, server.http_url, transport=None, init_script=NO_WEBRTC
            )
            socket_frames = page.frames_received()
            await page.start()
            await page.session_id()
            used = await page.text("#transport-used")
            assert used.startswith("WebSocket (WebRTC unavailable: this browser has no WebRTC")
            await page.wait_text("#conversation", ANSWER)
            await page.wait_state("listening")
            assert await page.turns("assistant") == [ANSWER]
            assert await page.text("#alert") == ""
    assert any('"response.output_audio.delta"' in frame for frame in socket_frames)


async def test_a_server_without_webrtc_gets_the_websocket(tmp_path):
    """``POST /v1/realtime/calls`` answers 404 (a server, or a proxy in front
    of it, without WebRTC): the page says so and talks over the WebSocket."""
    with voice_server(tmp_path) as server:
        async with chromium(question_wav(tmp_path)) as browser:
            page = await VoicePage.open(browser, server.http_url, transport=None)
            await page.page.route(
                "**/v1/realtime/calls", lambda route: route.fulfill(status=404, body="")
            )
            await page.start()
            await page.session_id()
            used = await page.text("#transport-used")
            assert (
                used
                == "WebSocket (WebRTC unavailable: the server does not offer WebRTC (HTTP 404))"
            )
            await page.wait_text("#conversation", ANSWER)
            assert await page.turns("assistant") == [ANSWER]


async def test_speaking_over_the_answer_cuts_it_on_the_track(tmp_path):
    """Barge-in over WebRTC: the server empties its track at the cut and
    acknowledges (truncating) what it had sent; the page marks the answer
    interrupted, shows the words that fit in what played, and answers anew."""
    over = PHRASES[4]
    wav = write_wav(
        tmp_path / "over.wav", quiet(2500), said(PHRASES[0]), quiet(1500), said(over), quiet(5000)
    )
    with voice_server(tmp_path) as server:
        async with chromium(wav) as browser:
            page = await VoicePage.open(browser, server.http_url, transport=None)
            await page.start()
            session_id = await page.session_id()
            await page.wait_text("#conversation", f"You said: {over}.")
            await page.wait_state("listening")
            cut, second = await page.turns("assistant")
            badges = await page.page.locator("#conversation .badge").all_inner_texts()
            seen = await page.states_seen()
        lines = log_lines(server, session_id)
    assert "interrupted" in seen and seen.index("speaking") < seen.index("interrupted")
    assert badges == ["interrupted"] and second == f"You said: {over}."
    assert cut.endswith(" —") and cut != ANSWER
    assert ANSWER.startswith(cut.removesuffix(" —"))
    first_id = next(
        line["body"]["response_id"]
        for line in lines
        if line["kind"] == "out" and line["body"]["audio_ms"] > 0
    )
    acks = [
        line["body"]
        for line in lines
        if line["kind"] == "ack" and line["body"].get("response_id") == first_id
    ]
    generated = sum(
        line["body"]["audio_ms"]
        for line in lines
        if line["kind"] == "out" and line["body"].get("response_id") == first_id
    )
    assert acks[-1].get("truncate") is True and 0 < acks[-1]["played_ms"] < generated


async def test_a_server_killed_mid_answer_is_resumed_with_a_new_offer(tmp_path):
    """``kill -9`` of the server (SQLite store) while it speaks: the page's
    peer connection goes silent, it says so, and once the server is back a
    new offer naming the session (its resume token and the last event seen)
    continues the same conversation over WebRTC."""
    first_phrase, next_phrase = PHRASES[0], PHRASES[2]
    wav = write_wav(
        tmp_path / "two.wav",
        quiet(2500),
        said(first_phrase),
        quiet(18_000),
        said(next_phrase),
        quiet(4000),
    )
    store = f"sqlite:{tmp_path / 'sessions.db'}"
    first = start_voice_server(tmp_path, store)
    second = None
    try:
        async with chromium(wav) as browser:
            page = await VoicePage.open(browser, first.http_url, transport=None)
            offers: list[str] = []
            page.page.on(
                "request",
                lambda request: (
                    offers.append(request.url)
                    if request.method == "POST" and "/v1/realtime/calls" in request.url
                    else None
                ),
            )
            await page.start()
            session_id = await page.session_id()
            await page.wait_state("speaking")
            first.kill9()  # mid-answer: no shutdown, no SCTP close, nothing flushed
            await page.wait_text("#notice", "Connection lost")
            second = start_voice_server(tmp_path, store, port=first.port)
            notice = await page.wait_text("#notice", "Reconnected")
            assert f"the same session ({session_id}) resumed" in notice
            assert await page.text("#transport-used") == "WebRTC"
            await page.wait_text("#conversation", f"You said: {next_phrase}.")
            await page.wait_state("listening")
            user = await page.turns("user")
            answers = await page.turns("assistant")
            badges = await page.page.locator("#conversation .badge").all_inner_texts()
            seen = await page.states_seen()
            assert await page.text("#alert") == ""
        lines = log_lines(second, session_id)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert "reconnecting" in seen
    assert user == [first_phrase, next_phrase]
    cut, answer = answers
    assert badges == ["cut by a server restart"]
    assert f"You said: {first_phrase}.".startswith(cut.removesuffix(" —"))
    assert answer == f"You said: {next_phrase}."
    # The first offer opened the session; the one that counted after the
    # restart named it (the failed tries while the server was down posted nothing).
    assert "session_id" not in offers[0]
    assert f"session_id={session_id}" in offers[-1] and "resume_token=" in offers[-1]
    leases = [line["body"]["action"] for line in lines if line["kind"] == "lease"]
    assert leases[0] == "attach" and "takeover" in leases and "resume" in leases
    heard = [line["body"]["transcript"] for line in lines if line["kind"] == "commit"]
    assert heard == [first_phrase, next_phrase]


async def test_webrtc_only_says_why_it_cannot_call(tmp_path):
    """*WebRTC only* in a browser without it: no fallback, and the page says
    what to do."""
    with voice_server(tmp_path) as server:
        async with chromium() as browser:
            page = await VoicePage.open(
                browser, server.http_url, transport="webrtc", init_script=NO_WEBRTC
            )
            assert await page.page.input_value("#transport") == "webrtc"
            frames = page.frames_received()
            await page.start()
            alert = await page.wait_text("#alert", "WebRTC cannot carry this call")
            assert "no WebRTC" in alert and "Choose another connection" in alert
            assert await page.state() == "ended"
            assert await page.page.is_enabled("#start")
    assert frames == []
