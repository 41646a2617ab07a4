"""Spoken test input: eSpeak NG speech at a client's rate, and the phrases the
recogniser is told to expect."""

from __future__ import annotations

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


def silence(ms: float, rate: int = 24_000) -> bytes:
    return b"\0\0" * int(rate * ms / 1000)
