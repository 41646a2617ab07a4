"""Spoken test input: eSpeak NG speech at a client's rate, and the phrases the
recogniser is told to expect."""

from __future__ import annotations

import subprocess
import sys
from functools import cache

from duplex_server.audio import resample_pcm16
from duplex_server.engine.audio.espeak import Espeak

# The test vocabulary; the answers are the parrot's "You said: <phrase>."
PHRASES = [
    "turn on the lights please",
    "what time is it",
    "good morning",
    "open the door",
    "play some music",
]
ANSWERS = [f"you said {phrase}" for phrase in PHRASES]
VOICE = "en-us+f3"


def speak(text: str, rate: int = 24_000, speed: float = 1.0) -> bytes:
    espeak = Espeak.shared()
    return resample_pcm16(espeak.synthesize(text, VOICE, speed), espeak.sample_rate_hz, rate)


@cache
def speak_afresh(text: str, rate: int = 24_000, speed: float = 1.0) -> bytes:
    """``speak`` in a new process, so always the same bytes: eSpeak NG
    carries its pitch flutter from one call to the next (nothing resets it,
    not even a new ``espeak_Initialize``), so speech made in this process
    depends on what was spoken before it, and a test that needs Whisper to
    hear exact words must not draw its audio from that lottery."""
    script = "import sys; from tests.speech import speak; "
    script += "sys.stdout.buffer.write(speak(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))"
    done = subprocess.run(
        [sys.executable, "-c", script, text, str(rate), str(speed)], capture_output=True, check=True
    )
    return done.stdout


def silence(ms: float, rate: int = 24_000) -> bytes:
    return b"\0\0" * int(rate * ms / 1000)
