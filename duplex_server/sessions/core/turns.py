"""Server VAD turn-taking: speech probabilities in, speech start/stop out.

Pure: the scores come from a model's voice-activity stage, the times are on
the session's input timeline (milliseconds of all audio written), and the
gate holds no clock. The decisions it makes are logged; the gate itself is
a cache that a restored session starts afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from protocol.session_config import TurnDetection

# A start needs this much speech in a row: a click or a breath is not a turn.
MIN_SPEECH_MS = 64.0
# Speech over the assistant longer than this is a barge-in; shorter is a
# remark ("mm-hm") that the assistant talks through.
BARGE_IN_MS = 400.0


@dataclass(frozen=True)
class Transition:
    # speech_sustained: the speech has lasted BARGE_IN_MS (once per utterance)
    kind: Literal["speech_started", "speech_sustained", "speech_stopped"]
    at_ms: float  # start of the speech, end of the last speech window, or now


class VadGate:
    def __init__(self, settings: TurnDetection, window_ms: float) -> None:
        self.threshold = float(settings.threshold)  # type: ignore[arg-type]  # merged: always set
        self.silence_ms = float(settings.silence_duration_ms)  # type: ignore[arg-type]  # merged: set
        self.window_ms = window_ms
        self.speaking = False
        self._run_start: float | None = None  # first window of a run of speech
        self._last_speech_end = 0.0
        self._sustained = False

    def push(self, end_ms: float, probability: float) -> list[Transition]:
        """One scored window ending at ``end_ms``; the transitions it causes."""
        start_ms = end_ms - self.window_ms
        voiced = probability >= self.threshold
        if not self.speaking:
            if not voiced:
                self._run_start = None
                return []
            if self._run_start is None:
                self._run_start = start_ms
            if end_ms - self._run_start < MIN_SPEECH_MS:
                return []
            self.speaking = True
            self._sustained = False
            self._last_speech_end = end_ms
            return [Transition("speech_started", self._run_start)]
        if voiced:
            self._last_speech_end = end_ms
            assert self._run_start is not None
            if not self._sustained and end_ms - self._run_start >= BARGE_IN_MS:
                self._sustained = True
                return [Transition("speech_sustained", end_ms)]
            return []
        if end_ms - self._last_speech_end < self.silence_ms:
            return []
        self.speaking = False
        self._run_start = None
        return [Transition("speech_stopped", self._last_speech_end)]


@dataclass
class Overlap:
    """Speech that began while the assistant was speaking, until it is resolved
    (``barge_in`` or ``listen`` once sustained; a ``drop`` if it stops first)."""

    started_ms: float
    response_id: str
    action: Literal["barge_in", "listen"] | None = None
