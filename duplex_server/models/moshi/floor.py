"""Who holds the floor, read off a native duplex model's own voice.

Moshi speaks every frame (silence included) and has no floor token, so the
session's turn events come from its output: the first frame loud enough
takes the floor (``speak``), and ``quiet_frames`` quiet frames in a row give
it back (``end_of_turn``). While it listens, its (near-silent) frames are
not sent. A fence (cancel, barge-in) makes it listen again; the model's own
stream goes on untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duplex_server.sessions.core.model_port import UnitDecision

# RMS of the model's float samples above which it is talking (about -40 dBFS).
SPEAKING_RMS = 0.01
QUIET_FRAMES = 6  # 480 ms of its own silence ends its turn


@dataclass
class Floor:
    speaking: bool = False
    quiet: int = 0  # quiet frames in a row while speaking
    quiet_frames: int = QUIET_FRAMES

    def update(self, samples: np.ndarray) -> UnitDecision | None:
        """This frame's decision: 'speak', 'end_of_turn', 'listen', or None (keeps speaking)."""
        loud = samples.size > 0 and float(np.sqrt(np.mean(np.square(samples)))) > SPEAKING_RMS
        if not self.speaking:
            if not loud:
                return "listen"
            self.speaking, self.quiet = True, 0
            return "speak"
        self.quiet = 0 if loud else self.quiet + 1
        if self.quiet >= self.quiet_frames:
            self.speaking, self.quiet = False, 0
            return "end_of_turn"
        return None

    def interrupt(self) -> None:
        self.speaking, self.quiet = False, 0
