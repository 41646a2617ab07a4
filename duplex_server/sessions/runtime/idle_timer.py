"""OpenAI's ``turn_detection.idle_timeout_ms``: when the user says nothing for
that long after the answer finished playing, the server commits the silence
and answers it (the model may prompt the user to go on).

Counted in input audio time, the clock a VAD session already runs on (the
client streams its microphone, silence included): the silent stretch starts
where the answer's audio ends if it was played from the moment it started
(or when the answer ended, if later; or when the timeout was set, if later
still). It fires once a silence: the nudge's own answer starts no second
one until the user has spoken. An answer that called a tool waits for the
client's tool output, not for the user. No wall clock, so a replay or a
slow machine decides the same.
"""

from __future__ import annotations

from duplex_server.sessions.core.heard import IdleTimedOut
from duplex_server.sessions.core.state import Response, SessionState


class IdleTimer:
    def __init__(self) -> None:
        self._answer_id = ""  # the newest answer seen in progress
        self._answer_started_ms = 0.0  # input audio time when it was first seen
        self._timed_for = ""  # the answer whose silence is (or was) timed
        self._silent_from_ms: float | None = None
        self._timeout_ms: float | None = None
        self._nudged = False  # a timeout fired and the user has not spoken since

    def check(self, state: SessionState) -> IdleTimedOut | None:
        """After an append: the timeout, if the silence since the last answer
        just reached it."""
        now = state.input.end_ms
        timeout_ms = _idle_timeout_ms(state)
        if timeout_ms != self._timeout_ms:
            self._timeout_ms = timeout_ms
            if self._silent_from_ms is not None:  # counted from the change, not before it
                self._silent_from_ms = max(now, self._silent_from_ms)
        if state.response is not None:
            if state.response.id != self._answer_id:
                self._answer_id, self._answer_started_ms = state.response.id, now
            self._silent_from_ms = None
            return None
        if state.user_speaking:
            self._silent_from_ms, self._nudged = None, False
            return None
        last = state.last_response
        if last is not None and last.id != self._timed_for:
            self._timed_for = last.id
            self._silent_from_ms = self._silence_after(last, now)
        silent_from = self._silent_from_ms
        if timeout_ms is None or silent_from is None or now - silent_from < timeout_ms:
            return None
        self._silent_from_ms, self._nudged = None, True
        return IdleTimedOut(start_ms=silent_from, end_ms=now)

    def _silence_after(self, answer: Response, now: float) -> float | None:
        """Where the silence after ``answer`` starts; None when it is not
        the user's turn to speak (a tool call is out, or the user was just
        nudged and said nothing)."""
        if answer.call_item_ids or self._nudged:
            return None
        started = self._answer_started_ms if answer.id == self._answer_id else now
        return max(now, started + answer.playback.generated_ms)


def _idle_timeout_ms(state: SessionState) -> float | None:
    """OpenAI serves the idle timeout under ``server_vad`` only."""
    detection = state.config.turn_detection
    if detection is None or detection.type != "server_vad":
        return None
    timeout = detection.idle_timeout_ms
    return float(timeout) if isinstance(timeout, int) and timeout > 0 else None
