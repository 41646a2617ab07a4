"""The voice page across a server crash: ``kill -9`` of a real server process
(SQLite store) while it speaks, a restart on the same port and database, and
the page carries on with the same session; and a server that never comes
back, which the page gives up on after a bounded number of tries, saying so."""

from __future__ import annotations

from tests.e2e.voicepage import (
    DroppingProxy,
    VoicePage,
    chromium,
    log_lines,
    quiet,
    said,
    start_voice_server,
    voice_server,
    write_wav,
)
from tests.speech import PHRASES
from tests.tcpproxy import PausableProxy

FIRST, NEXT = PHRASES[0], PHRASES[2]


async def test_a_server_killed_mid_answer_costs_a_pause_not_the_conversation(tmp_path):
    # The next question comes 13 s after the first: time to crash and restart.
    wav = write_wav(
        tmp_path / "two.wav", quiet(1500), said(FIRST), quiet(13_000), said(NEXT), quiet(4000)
    )
    store = f"sqlite:{tmp_path / 'sessions.db'}"
    first = start_voice_server(tmp_path, store)
    second = None
    try:
        async with chromium(wav) as browser:
            page = await VoicePage.open(browser, first.http_url)
            await page.start()
            session_id = await page.session_id()
            await page.wait_state("speaking")
            first.kill9()  # mid-answer: no shutdown, nothing flushed
            await page.wait_text("#notice", "Connection lost")
            second = start_voice_server(tmp_path, store, port=first.port)
            notice = await page.wait_text("#notice", "Reconnected")
            assert f"the same session ({session_id}) resumed" in notice
            assert await page.text("#session") == session_id
            await page.wait_text("#conversation", f"You said: {NEXT}.")
            await page.wait_state("listening")
            user = await page.turns("user")
            answers = await page.turns("assistant")
            badges = await page.page.locator("#conversation .badge").all_inner_texts()
            notes = await page.page.locator("#conversation .note").all_inner_texts()
            seen = await page.states_seen()
            assert await page.text("#alert") == ""
        lines = log_lines(second, session_id)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert "reconnecting" in seen
    assert user == [FIRST, NEXT]
    # The answer the crash cut shows what was heard of it and why it stopped.
    cut, answer = answers
    assert badges == ["cut by a server restart"]
    assert cut.endswith(" —") and f"You said: {FIRST}.".startswith(cut.removesuffix(" —"))
    assert answer == f"You said: {NEXT}."
    assert len(notes) == 1 and notes[0].startswith("reconnected after")
    # The log, read from the restarted server: one session, taken over by the
    # second server and resumed by the page; the first answer closed as cut by
    # the restart where the page had played it; the next turn taken in it.
    leases = [line["body"]["action"] for line in lines if line["kind"] == "lease"]
    assert leases[0] == "attach" and "takeover" in leases
    assert leases.index("takeover") < leases.index("resume")
    ended = [
        (body["response_id"], body["status"], body.get("reason"))
        for body in (line["body"] for line in lines if line["kind"] == "decision")
        if body["action"] == "response_done"
    ]
    (first_id, _, _), (next_id, _, _) = ended
    assert ended == [(first_id, "incomplete", "server_restart"), (next_id, "completed", None)]
    truncated = [
        line["body"] for line in lines if line["kind"] == "ack" and line["body"].get("truncate")
    ]
    assert [ack["response_id"] for ack in truncated] == [first_id]
    assert truncated[0]["played_ms"] > 0
    heard = [line["body"]["transcript"] for line in lines if line["kind"] == "commit"]
    assert heard == [FIRST, NEXT]


async def test_a_dropped_connection_resumes_and_the_answer_goes_on(tmp_path):
    """The network drops while the answer plays and the server lives on: the
    page resumes the same session at once, the server replays what the page
    missed, and the answer is heard to its end; the next question is answered."""
    wav = write_wav(
        tmp_path / "two.wav", quiet(1500), said(FIRST), quiet(6000), said(NEXT), quiet(4000)
    )
    with voice_server(tmp_path) as server:
        proxy = await DroppingProxy(server.port).start()
        try:
            async with chromium(wav) as browser:
                page = await VoicePage.open(browser, proxy.http_url)
                await page.start()
                session_id = await page.session_id()
                await page.wait_state("speaking")
                proxy.drop()
                notice = await page.wait_text("#notice", "Reconnected")
                assert f"the same session ({session_id}) resumed" in notice
                await page.wait_text("#conversation", f"You said: {NEXT}.")
                await page.wait_state("listening")
                answers = await page.turns("assistant")
                badges = await page.page.locator("#conversation .badge").all_inner_texts()
                seen = await page.states_seen()
        finally:
            await proxy.close()
        lines = log_lines(server, session_id)
    assert "reconnecting" in seen
    assert answers == [f"You said: {FIRST}.", f"You said: {NEXT}."]
    assert badges == []  # nothing was cut: the drop cost a pause only
    leases = [line["body"]["action"] for line in lines if line["kind"] == "lease"]
    assert "takeover" not in leases and leases.count("resume") == 1
    # The first answer's playback was acknowledged to its end across the drop.
    done = [
        body
        for body in (line["body"] for line in lines if line["kind"] == "decision")
        if body["action"] == "response_done"
    ]
    assert [body["status"] for body in done] == ["completed", "completed"]
    first_id = done[0]["response_id"]
    generated = sum(
        line["body"]["audio_ms"]
        for line in lines
        if line["kind"] == "out" and line["body"].get("response_id") == first_id
    )
    played = [
        line["body"]["played_ms"]
        for line in lines
        if line["kind"] == "ack" and line["body"].get("response_id") == first_id
    ]
    assert abs(played[-1] - generated) < 30, (played, generated)


async def test_a_silent_network_is_noticed_and_the_session_resumed_when_it_heals(tmp_path):
    """A network that swallows packets closes nothing: the page notices the
    silence (no heartbeat answered), drops the socket, keeps trying, and once
    the network heals it resumes the same session and answers the next question."""
    wav = write_wav(
        tmp_path / "two.wav", quiet(1500), said(FIRST), quiet(20_000), said(NEXT), quiet(4000)
    )
    with voice_server(tmp_path) as server:
        proxy = await PausableProxy(server.port).start()
        try:
            async with chromium(wav) as browser:
                page = await VoicePage.open(browser, f"http://127.0.0.1:{proxy.port}")
                await page.start()
                session_id = await page.session_id()
                await page.wait_text("#conversation", f"You said: {FIRST}.")
                await page.wait_state("listening")
                proxy.pause()  # bytes held both ways, no close: only silence tells
                await page.wait_text("#notice", "Connection lost", timeout_ms=20_000)
                proxy.resume()
                notice = await page.wait_text("#notice", "Reconnected")
                assert f"the same session ({session_id}) resumed" in notice
                await page.wait_text("#conversation", f"You said: {NEXT}.")
                answers = await page.turns("assistant")
                assert await page.text("#alert") == ""
        finally:
            await proxy.close()
        lines = log_lines(server, session_id)
    assert answers == [f"You said: {FIRST}.", f"You said: {NEXT}."]
    heard = [line["body"]["transcript"] for line in lines if line["kind"] == "commit"]
    assert heard == [FIRST, NEXT]


async def test_a_server_gone_for_good_is_given_up_on_and_said_so(tmp_path):
    wav = write_wav(tmp_path / "quiet.wav", quiet(3000))
    server = start_voice_server(tmp_path)
    try:
        async with chromium(wav) as browser:
            page = await VoicePage.open(browser, server.http_url)
            await page.start()
            await page.session_id()
            await page.wait_state("listening")
            server.kill9()
            await page.wait_text("#notice", "try 1 of 7")
            alert = await page.wait_text("#alert", "did not come back", timeout_ms=45_000)
            notices = await page.states_seen()
            start_enabled = await page.page.is_enabled("#start")
    finally:
        server.stop()
    assert "7 tries to reconnect" in alert and "press Start for a new one" in alert
    assert notices[-2:] == ["reconnecting", "ended"]
    assert start_enabled  # the page is not dead: a new call can be started
