"""What a listener of one session hears, timed for ``/metrics``.

Measured where the server can see it: when the answer's first audio is
recorded (it goes to the socket right after), not when the client plays it.
The marks are wall-clock (``time.perf_counter``) and stay out of the log:
they describe this process serving the session, not the session.

- commit → first audio: from the ``input_audio_buffer.commit`` frame's
  arrival to the first audio of the answer that started after it;
- speech stopped → first audio: from the server VAD's decision that the
  speech ended to that first audio;
- barge-in → silence: from the arrival of the frame that barged in (the
  audio that VAD heard as speech, or a ``barge_in``/``turn.signal``) to the
  fence that stops the answer's audio being recorded;
- underruns: an answer whose next audio was recorded later than the audio
  before it would have finished playing, had playback started with its
  first audio (``UNDERRUN_GRACE_MS`` of jitter allowed).
"""

from __future__ import annotations

from duplex_server import metrics
from duplex_server.sessions.core.records import FenceBody, Record
from duplex_server.sessions.core.state import SessionState

# A jitter buffer this deep absorbs later audio without a gap.
UNDERRUN_GRACE_MS = 40.0


class AnswerTiming:
    def __init__(self) -> None:
        self._commit_at: float | None = None
        self._stopped_at: float | None = None
        # The answer being timed: its id, when it started, its first audio,
        # the audio recorded so far and whether the last gap was counted.
        self._response_id: str | None = None
        self._started_at = 0.0
        self._first_audio_at: float | None = None
        self._generated_ms = 0.0

    def committed(self, received_at: float) -> None:
        self._commit_at = received_at

    def speech_stopped(self, at: float) -> None:
        self._stopped_at = at

    def landed(
        self, state: SessionState, records: list[Record], input_at: float | None, now: float
    ) -> None:
        """A batch was appended; ``input_at``: when the client frame being
        applied arrived (None for engine output)."""
        if input_at is not None and any(
            isinstance(r.body, FenceBody) and r.body.reason == "barge_in" for r in records
        ):
            metrics.BARGE_IN_TO_SILENCE.observe(now - input_at)
        response = state.response
        if response is None:
            self._answer_ended()
            return
        if response.id != self._response_id:
            self._answer_ended()
            self._response_id, self._started_at = response.id, now
        generated_ms = response.playback.generated_ms
        if generated_ms > self._generated_ms:
            self._audio(generated_ms, now)

    def _audio(self, generated_ms: float, now: float) -> None:
        if self._first_audio_at is None:
            self._first_audio_at = now
            self._observe_first_audio(now)
        elif (now - self._first_audio_at) * 1000 > self._generated_ms + UNDERRUN_GRACE_MS:
            metrics.AUDIO_UNDERRUNS.inc()
            # Played out and waiting: the listener's clock restarts with this audio.
            self._first_audio_at = now - self._generated_ms / 1000
        self._generated_ms = generated_ms

    def _observe_first_audio(self, now: float) -> None:
        if self._commit_at is not None and self._commit_at <= self._started_at:
            metrics.COMMIT_TO_FIRST_AUDIO.observe(now - self._commit_at)
            self._commit_at = None
        if self._stopped_at is not None and self._stopped_at <= self._started_at:
            metrics.SPEECH_STOPPED_TO_FIRST_AUDIO.observe(now - self._stopped_at)
            self._stopped_at = None

    def _answer_ended(self) -> None:
        """An answer without audio answered the marks before it; one with
        audio used them already."""
        if self._response_id is not None:
            if self._commit_at is not None and self._commit_at <= self._started_at:
                self._commit_at = None
            if self._stopped_at is not None and self._stopped_at <= self._started_at:
                self._stopped_at = None
        self._response_id = None
        self._first_audio_at = None
        self._generated_ms = 0.0
