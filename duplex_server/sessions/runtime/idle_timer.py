"""OpenAI's ``turn_detection.idle_timeout_ms``: when the user says nothing for
that long after the answer finished playing, the server commits the silence
and answers it (the model may prompt the user to go on).

Counted in input audio time, the clock a VAD session already runs on (the
client streams its microphone, silence included): the silent stretch starts
where the answer's audio ends if it was played from the moment it started
(or when the answer ended, if later), and the timer fires once per answer.
No wall clock, so a replay or a slow machine decides the same.
"""

from __future__ import annotations

from duplex_server.sessions.core.config import SERVED_BY_SERVER_VAD
from duplex_server.sessions.core.heard import IdleTimedOut
from duplex_server.sessions.core.state import SessionState


class IdleTimer:
    def __init__(self) -> None:
        self._answer_id = ""  # the newest answer seen in progress
        self._answer_started_ms = 0.0  # input audio time when it was first seen
        self._armed_for = ""  # the answer whose silence is (or was) being timed
        self._silent_from_ms: float | None = None

    def check(self, state: SessionState) -> IdleTimedOut | None:
        """After an append: the timeout, if the silence since the last answer
        just reached it."""
        now = state.input.end_ms
        timeout_ms = _idle_timeout_ms(state)
        if state.response is not None:
            if state.response.id != self._answer_id:
                self._answer_id, self._answer_started_ms = state.response.id, now
            self._silent_from_ms = None
            return None
        if state.user_speaking:
            self._silent_from_ms = None  # the user took the floor: no nudge for this answer
            return None
        last = state.last_response
        if last is not None and last.id != self._armed_for:
            started = self._answer_started_ms if last.id == self._answer_id else now
            self._armed_for = last.id
            self._silent_from_ms = max(now, started + last.playback.generated_ms)
        silent_from = self._silent_from_ms
        if timeout_ms is None or silent_from is None or now - silent_from < timeout_ms:
            return None
        self._silent_from_ms = None
        return IdleTimedOut(start_ms=silent_from, end_ms=now)


def _idle_timeout_ms(state: SessionState) -> float | None:
    detection = state.config.turn_detection
    if detection is None or detection.type not in SERVED_BY_SERVER_VAD:
        return None
    timeout = detection.idle_timeout_ms
    return float(timeout) if isinstance(timeout, int) and timeout > 0 else None
