"""The voice page at ``GET /`` in a real headless Chromium against a real
server process: a spoken question from a WAV file as the microphone, the
answer heard (its playback acknowledged in the log), and speech over the
answer cutting it where it was heard. Each test reads the page's text and
the session's log, as a person and an operator would."""

from __future__ import annotations

import json
import os
import re

from protocol.audio_frames import FrameKind, unpack
from tests.e2e.voicepage import (
    VoicePage,
    chromium,
    log_lines,
    quiet,
    said,
    voice_server,
    write_wav,
)
from tests.openai_conformance import check_event
from tests.speech import PHRASES

DESKTOP = {"width": 900, "height": 760}
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
ANSWER = f"You said: {PHRASES[0]}."


def audio_out(lines: list[dict], response_id: str | None = None) -> list[dict]:
    """The journaled audio deltas of a session's log (of one response)."""
    return [
        line
        for line in lines
        if line["kind"] == "out"
        and line["body"]["audio_ms"] > 0
        and response_id in (None, line["body"]["response_id"])
    ]


async def test_a_spoken_question_is_answered_aloud_on_a_phone_screen(tmp_path):
    wav = write_wav(tmp_path / "question.wav", quiet(1500), said(PHRASES[0]), quiet(6000))
    with voice_server(tmp_path) as server:
        async with chromium(wav) as browser:
            page = await VoicePage.open(browser, server.http_url, **PHONE)
            frames = page.frames_received()
            wire = page.frames_by_kind()
            assert await page.page.title() == "duplex-server: talk"
            # The model's capabilities are shown before the call starts, once
            # the model list (fetched when the page loads) has arrived.
            chips = await page.wait_text("#capabilities", "hears when you stop")
            assert "hears when you stop" in chips and "barge-in" in chips
            await page.page.select_option("#voice", "ash")
            await page.page.fill("#instructions", "Answer in one sentence.")
            await page.start()
            session_id = await page.session_id()
            await page.wait_text("#conversation", ANSWER)
            await page.wait_state("listening")  # the answer has played out
            assert await page.turns("user") == [PHRASES[0]]
            # While the question was spoken, what was heard of it so far.
            partials = await page.partials_seen()
            assert partials[0] == "…" and f"{PHRASES[0]}…" in partials
            assert all(PHRASES[0].startswith(p.removesuffix("…")) for p in partials)
            assert await page.turns("assistant") == [ANSWER]
            latency = await page.text("#conversation .turn.assistant .latency")
            assert re.fullmatch(r"\d+\.\d\d s to first audio", latency), latency
            assert "after you stopped speaking" in await page.text("#latency")
            seen = await page.states_seen()
            assert seen == [
                "idle",
                "connecting",
                "listening",
                "hearing you",
                "thinking",
                "speaking",
                "listening",
            ]
            # Nothing on the page is wider than the phone's screen.
            overflow = await page.page.evaluate(
                "document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0
            assert await page.text("#alert") == ""
        lines = log_lines(server, session_id)
    opening = next(line["body"] for line in lines if line["kind"] == "config")
    assert (opening["patch"]["voice"], opening["patch"]["instructions"]) == (
        "ash",
        "Answer in one sentence.",
    )
    # The page acknowledged what it played, all of the answer, in the log.
    (response_id,) = {line["body"]["response_id"] for line in audio_out(lines)}
    answer_ms = sum(line["body"]["audio_ms"] for line in audio_out(lines))
    acks = [line["body"] for line in lines if line["kind"] == "ack"]
    played = [a["played_ms"] for a in acks if a["what"] == "playback"]
    assert {a["response_id"] for a in acks if a["what"] == "playback"} == {response_id}
    assert len(played) > 3 and played == sorted(played)
    assert abs(played[-1] - answer_ms) < 30, (played[-1], answer_ms)
    # What the page received on its socket held to the openai SDK's GA models.
    checked = [check_event(frame, "ga") for frame in frames]
    assert len(checked) > 20 and [v for v in checked if v is not None] == []
    # The page spoke binary audio (?audio=binary): its microphone went up in
    # input frames, no base64 appends, and the answer came down in output
    # frames, each right after its delta event, which carried no audio.
    assert_binary_audio(wire, lines)


def assert_binary_audio(wire: dict[str, list], lines: list[dict]) -> None:
    sent = [unpack(f, 1 << 20) for f in wire["sent"] if isinstance(f, bytes)]
    assert len(sent) > 20 and {f.kind for f in sent} == {FrameKind.INPUT_APPEND}
    assert not [f for f in wire["sent"] if isinstance(f, str) and "input_audio_buffer.append" in f]
    logged = [line for line in lines if line["kind"] == "audio"]
    # Each frame logged as the append it stands for, in order. A frame the
    # microphone sent as the browser closed can reach the server after the
    # browser stopped reporting its socket: a frame or two more may be logged.
    assert len(sent) <= len(logged) <= len(sent) + 2, (len(sent), len(logged))
    assert [round(line["body"]["duration_ms"], 3) for line in logged[: len(sent)]] == [
        round(f.duration_us / 1000, 3) for f in sent
    ]
    received = wire["received"]
    pairs = [
        (json.loads(received[i]), unpack(received[i + 1], 1 << 20))
        for i, frame in enumerate(received)
        if isinstance(frame, str) and '"type":"response.output_audio.delta"' in frame
    ]
    assert pairs and all(e["delta"] == "" and f.sequence == e["server_event_seq"] for e, f in pairs)
    assert sum(isinstance(f, bytes) for f in received) == len(pairs)


async def test_speaking_over_the_answer_cuts_it_where_it_was_heard(tmp_path):
    """The second question starts while the first answer plays: the page stops
    the answer, says it was interrupted, shows only what was heard of it, and
    tells the server exactly how much that was (a truncating ack); then it
    answers the new question."""
    over = PHRASES[4]
    wav = write_wav(
        tmp_path / "over.wav", quiet(1500), said(PHRASES[0]), quiet(1500), said(over), quiet(5000)
    )
    with voice_server(tmp_path) as server:
        async with chromium(wav) as browser:
            page = await VoicePage.open(browser, server.http_url, viewport=DESKTOP)
            await page.start()
            session_id = await page.session_id()
            await page.wait_text("#conversation", f"You said: {over}.")
            await page.wait_state("listening")
            cut, second = await page.turns("assistant")
            badges = await page.page.locator("#conversation .badge").all_inner_texts()
            seen = await page.states_seen()
            if path := os.environ.get("VOICE_PAGE_SCREENSHOT"):
                await page.page.screenshot(path=path, full_page=True)
        lines = log_lines(server, session_id)
    assert "interrupted" in seen and seen.index("speaking") < seen.index("interrupted")
    assert badges == ["interrupted"]
    assert second == f"You said: {over}."
    # The cut answer shows a beginning of the first answer, no more, and a dash.
    assert cut.endswith(" —") and cut != ANSWER
    heard = cut.removesuffix(" —")
    assert ANSWER.startswith(heard)
    # The log: the first answer was cancelled by the barge-in, and the page's
    # last acknowledgement of it truncates it where playback stopped.
    first_id = audio_out(lines)[0]["body"]["response_id"]
    acks = [
        line["body"]
        for line in lines
        if line["kind"] == "ack" and line["body"].get("response_id") == first_id
    ]
    generated = sum(line["body"]["audio_ms"] for line in audio_out(lines, first_id))
    assert acks[-1].get("truncate") is True
    assert 0 < acks[-1]["played_ms"] < generated
    assert not any(a.get("truncate") for a in acks[:-1])
    # The page showed the words that fit in what was played.
    assert len(heard) <= len(ANSWER) * acks[-1]["played_ms"] / generated + 8
