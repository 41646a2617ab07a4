"""Who holds the floor, read off a native duplex model's own output.

Moshi speaks every frame and has no floor token, but its text stream says
when it talks: a word piece at each word, its pad token (or another special
token) in between and while it says nothing. The first frame with a word
takes the floor (``speak``); ``QUIET_FRAMES`` frames in a row without one
give it back (``end_of_turn``): long enough to span a word's own audio
after its token and a pause between words. If the user is talking while
the model has gone quiet for ``YIELD_FRAMES`` frames, the model gave way to
them (``yield``): barge-in is the model's own decision, read off its output.
A checkpoint without a tokenizer has no known pad token; its floor is read
off its voice level instead (``voiced_by_level``). While the model listens,
its frames are not sent. A fence (cancel, barge-in) takes the floor from
it: the model's own stream goes on untouched, so what it was saying is not
sent, and it takes the floor again only after ``YIELD_FRAMES`` quiet frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duplex_server.sessions.core.model_port import UnitDecision

QUIET_FRAMES = 10  # 800 ms without a word ends the model's turn
YIELD_FRAMES = 3  # 240 ms of the model's quiet under the user's speech is a yield
# RMS of float samples above which a voice is sounding (about -40 dBFS) ...
SPEAKING_RMS = 0.01
# ... and above which the user is talking (about -30 dBFS).
TALKING_RMS = 0.03


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples)))) if samples.size else 0.0


def voiced_by_level(samples: np.ndarray) -> bool:
    return rms(samples) > SPEAKING_RMS


@dataclass
class Floor:
    speaking: bool = False
    quiet: int = 0  # frames in a row without a word, while speaking
    overlapped: int = 0  # of those, in a row, with the user talking
    fenced: int = 0  # after a fence: quiet frames still to wait before it may speak

    def update(self, voiced: bool, user_talking: bool) -> UnitDecision | None:
        """This frame's decision: 'speak', 'end_of_turn', 'yield', 'listen',
        or None (it keeps speaking)."""
        if self.fenced:
            self.fenced = YIELD_FRAMES if voiced else self.fenced - 1
            return "listen"
        if not self.speaking:
            if not voiced:
                return "listen"
            self.speaking, self.quiet, self.overlapped = True, 0, 0
            return "speak"
        if voiced:
            self.quiet, self.overlapped = 0, 0
            return None
        self.quiet += 1
        self.overlapped = self.overlapped + 1 if user_talking else 0
        if self.overlapped >= YIELD_FRAMES:
            self._listen()
            return "yield"
        if self.quiet >= QUIET_FRAMES:
            self._listen()
            return "end_of_turn"
        return None

    def interrupt(self) -> None:
        """The session fenced the model's answer."""
        self._listen()
        self.fenced = YIELD_FRAMES

    def _listen(self) -> None:
        self.speaking, self.quiet, self.overlapped = False, 0, 0
