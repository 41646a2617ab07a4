"""The ``scripted`` model: a native duplex model on a fixed schedule, for
tests and benches of the streaming port (as ``echo`` is for the turn-based one).

It takes every 80 ms unit as it arrives and never waits for a commit: it
listens for ``LISTEN_UNITS`` units, then takes the floor and speaks for
``SPEAK_UNITS`` units (a tone and one word per unit, one response held open
across them), ends its turn, and listens again. When the user's energy
rises while it speaks, it yields the floor at once. Its state is the unit
count and the floor: nothing a restarted session cannot start afresh.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from duplex_server.models.capabilities import built_in
from duplex_server.sessions.core.model_port import InputUnit, SteppedUnit, StreamSetup, UnitOutput
from protocol.capabilities import CLIENT_EVENT, MODEL_NATIVE

RATE_HZ = 24_000
UNIT_MS = 80
LISTEN_UNITS = 5
SPEAK_UNITS = 8
# RMS of pcm16 above which the user is talking (about -30 dBFS).
TALKING_RMS = 1000.0
WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight")


def _tone(index: int) -> bytes:
    t = (np.arange(RATE_HZ * UNIT_MS // 1000) + index * RATE_HZ * UNIT_MS // 1000) / RATE_HZ
    return (np.sin(2 * np.pi * 330.0 * t) * 6000).astype("<i2").tobytes()


def rms(pcm16: bytes) -> float:
    samples = np.frombuffer(pcm16, "<i2").astype(np.float64)
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0


class ScriptedSession:
    def __init__(self) -> None:
        self.heard = 0  # units listened to since the floor was last given back
        self.spoken = 0  # units of the current answer

    async def step(self, unit: InputUnit) -> list[UnitOutput]:
        if self.spoken:
            return [self._speaking(unit)]
        if rms(unit.pcm) > TALKING_RMS:
            self.heard = 0  # the user has the floor: wait for them to finish
            return [UnitOutput(decision="listen")]
        self.heard += 1
        if self.heard < LISTEN_UNITS:
            return [UnitOutput(decision="listen")]
        self.heard = 0
        self.spoken = 1
        return [UnitOutput(decision="speak", audio=_tone(0), sample_rate_hz=RATE_HZ, text=WORDS[0])]

    def _speaking(self, unit: InputUnit) -> UnitOutput:
        if rms(unit.pcm) > TALKING_RMS:
            self.spoken = 0
            return UnitOutput(decision="yield")
        if self.spoken >= SPEAK_UNITS:
            self.spoken = 0
            return UnitOutput(decision="end_of_turn")
        index, self.spoken = self.spoken, self.spoken + 1
        return UnitOutput(
            audio=_tone(index), sample_rate_hz=RATE_HZ, text=" " + WORDS[index % len(WORDS)]
        )

    def interrupt(self) -> None:
        self.spoken = 0
        self.heard = 0

    def close(self) -> None:
        pass


class ScriptedModel:
    name = "scripted"
    turn_detection_types: tuple[str, ...] = ()
    listening = None
    answering = None  # it takes the floor unit by unit; a commit never makes it answer
    loaded = True  # nothing to load
    # It takes the floor and yields by itself, unit by unit; a client's
    # commit or barge-in still ends a turn or cuts its answer. It hears only
    # the audio (its energy): a text append enters the conversation unread.
    capabilities = built_in(
        "native_duplex",
        UNIT_MS,
        signal_sources=[CLIENT_EVENT, MODEL_NATIVE],
        native_turn_policy=True,
        required_input_modalities=["audio"],
        optional_input_modalities=[],
        text_only_turn=False,
    )
    sample_rate_hz = RATE_HZ
    unit_ms = UNIT_MS
    resume_units = 0  # it logs no tokens: a restored session starts it afresh
    primes_at_input = False  # it keeps time from the session's start

    @property
    def streaming(self) -> ScriptedModel:
        return self

    def open(
        self, session_id: str, setup: StreamSetup, history: Sequence[SteppedUnit] = ()
    ) -> ScriptedSession:
        """Its state is the floor of the moment, not its past: ``history`` is not needed."""
        return ScriptedSession()

    def accepts_voice(self, voice: str) -> bool:
        return True

    def instructions_refusal(self, instructions: str) -> str | None:
        return None  # read as text, any length the session takes
