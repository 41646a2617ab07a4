"""OpenAI's ``turn_detection.idle_timeout_ms`` (runtime/idle_timer.py), driven
through the pure step the way the actor drives it after each append: once
the answer has played and the user has said nothing for that long, the
server says ``input_audio_buffer.timeout_triggered``, commits the silence
and answers it; once per answer; never while the user speaks."""

from __future__ import annotations

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.effects import StartAnswer
from duplex_server.sessions.core.heard import IdleTimedOut, SpeechStart
from duplex_server.sessions.core.model_port import ModelChunk
from duplex_server.sessions.core.responses import emit_chunk, finish_response
from duplex_server.sessions.core.state import SessionState
from duplex_server.sessions.runtime.idle_timer import IdleTimer
from protocol.session_config import TurnDetection
from tests.test_heard import MODEL, Session
from tests.wsclient import tone_pcm16

TIMEOUT_MS = 2000
APPEND_MS = 100


class TimedSession(Session):
    """A server VAD session with an idle timeout (its refold starts the same)."""

    def initial(self) -> SessionState:
        state = super().initial()
        state.config.turn_detection = TurnDetection(
            type="server_vad",
            create_response=True,
            interrupt_response=True,
            prefix_padding_ms=300,
            idle_timeout_ms=TIMEOUT_MS,
        )
        return state


def timed_session() -> Session:
    return TimedSession()


def finish_answer(session: Session, audio_ms: float = 0.0) -> None:
    """The answer in progress says ``audio_ms`` of audio and ends."""
    batch = Batch(session.state, MODEL.capabilities, session.clock)
    response = session.state.response
    assert response is not None
    if audio_ms:
        emit_chunk(batch, response, ModelChunk(audio=tone_pcm16(audio_ms), text="hi"))
    finish_response(batch, "completed")
    session.log.extend(batch.records)


def answered(session: Session, timer: IdleTimer, audio_ms: float = 200.0) -> None:
    """An answer of ``audio_ms``, seen in progress by the timer, then ended."""
    session.answering()
    timer.check(session.state)
    finish_answer(session, audio_ms=audio_ms)


def appends_until(session: Session, timer: IdleTimer, until_ms: float) -> IdleTimedOut | None:
    """Appends (the client's microphone) until input audio time reaches
    ``until_ms``; the first timeout the timer calls after one, if any."""
    while session.state.input.end_ms < until_ms:
        session.speak(APPEND_MS)
        if (fired := timer.check(session.state)) is not None:
            return fired
    return None


def test_the_silence_after_a_played_answer_is_committed_and_answered():
    session, timer = timed_session(), IdleTimer()
    session.speak(500)
    assert timer.check(session.state) is None  # no answer yet: nothing to time
    session.answering()
    started = session.state.input.end_ms
    assert timer.check(session.state) is None
    finish_answer(session, audio_ms=1000)
    # the answer plays for its 1 s from when it started; then 2 s of silence
    fired = appends_until(session, timer, started + 1000 + TIMEOUT_MS + 500)
    assert fired is not None and fired.start_ms == started + 1000
    assert TIMEOUT_MS <= fired.end_ms - fired.start_ms < TIMEOUT_MS + APPEND_MS
    effects = session.run(fired)
    told = session.events[session.events.index("input_audio_buffer.timeout_triggered") :]
    assert told[:2] == ["input_audio_buffer.timeout_triggered", "input_audio_buffer.committed"]
    assert any(isinstance(e, StartAnswer) for e in effects)  # the silence is answered
    triggered = next(e for e in session.sent if e["type"] == "input_audio_buffer.timeout_triggered")
    committed = [e for e in session.sent if e["type"] == "input_audio_buffer.committed"][-1]
    assert triggered["item_id"] == committed["item_id"]
    assert triggered["audio_start_ms"] == round(fired.start_ms)
    assert session.refold() == session.state


def test_once_a_silence_and_never_while_the_user_speaks():
    session, timer = timed_session(), IdleTimer()
    answered(session, timer)
    fired = appends_until(session, timer, session.state.input.end_ms + 200 + TIMEOUT_MS + 300)
    assert fired is not None
    session.run(fired)
    timer.check(session.state)
    finish_answer(session)  # the nudge's own answer ends
    # the user still says nothing: not nudged again
    assert appends_until(session, timer, session.state.input.end_ms + 3 * TIMEOUT_MS) is None
    # the user speaks on: however long, no timeout
    session.run(SpeechStart(session.state.input.end_ms))
    assert appends_until(session, timer, session.state.input.end_ms + 3 * TIMEOUT_MS) is None


def test_a_timeout_set_later_counts_from_then():
    session, timer = Session(), IdleTimer()
    answered(session, timer)
    assert appends_until(session, timer, session.state.input.end_ms + 3 * TIMEOUT_MS) is None
    set_at = session.state.input.end_ms
    session.state.config.turn_detection = TimedSession().initial().config.turn_detection
    fired = appends_until(session, timer, set_at + TIMEOUT_MS + 500)
    assert fired is not None and set_at <= fired.start_ms <= set_at + APPEND_MS  # seen next append


def test_an_answer_that_called_a_tool_waits_for_the_tool():
    session, timer = timed_session(), IdleTimer()
    session.answering()
    timer.check(session.state)
    response = session.state.response
    assert response is not None
    response.call_item_ids.append("item_call")  # the client is running the tool
    finish_answer(session)
    assert appends_until(session, timer, session.state.input.end_ms + 3 * TIMEOUT_MS) is None


def test_no_timeout_without_the_setting():
    session, timer = Session(), IdleTimer()
    answered(session, timer)
    assert appends_until(session, timer, session.state.input.end_ms + 10 * TIMEOUT_MS) is None
