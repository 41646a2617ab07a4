"""The voice pipeline's stages on real models shipped in wheels."""

from __future__ import annotations

import numpy as np

from duplex_server.engine.audio.espeak import Espeak, EspeakError
from duplex_server.engine.audio.silero import SileroModel, VadStream
from duplex_server.engine.audio.sphinx import Sphinx
from tests.speech import PHRASES, silence, speak


def test_espeak_speaks_and_speed_shortens():
    espeak = Espeak.shared()
    normal = espeak.synthesize("open the door", "en-us")
    fast = espeak.synthesize("open the door", "en-us", speed=2.0)
    assert espeak.sample_rate_hz == 22_050
    assert np.abs(np.frombuffer(normal, "<i2")).max() > 1000  # real sound, not silence
    assert len(fast) < 0.7 * len(normal)


def test_espeak_refuses_an_unknown_voice():
    try:
        Espeak.shared().synthesize("hello", "no-such-voice")
    except EspeakError as exc:
        assert "no-such-voice" in str(exc)
    else:
        raise AssertionError("an unknown voice was accepted")


def test_sphinx_recognises_the_test_phrases():
    sphinx = Sphinx(PHRASES)
    for phrase in PHRASES:
        assert sphinx.transcribe(speak(phrase, 16_000)) == phrase


def test_sphinx_hears_nothing_in_silence():
    assert Sphinx(PHRASES).transcribe(silence(800, 16_000)) == ""
    assert Sphinx(PHRASES).transcribe(b"") == ""


def test_silero_finds_the_speech_bounds():
    speech = speak("turn on the lights please", 16_000)
    stream = VadStream(SileroModel())
    scores = stream.feed(silence(1000, 16_000) + speech + silence(1000, 16_000))
    voiced = [end_ms for end_ms, p in scores if p >= 0.5]
    true_end = 1000 + len(speech) / 32
    assert abs(voiced[0] - 32 - 1000) <= 100
    assert abs(voiced[-1] - true_end) <= 100
    assert all(p < 0.5 for end_ms, p in scores if end_ms < 900)


def test_every_openai_voice_name_is_an_espeak_voice_that_speaks():
    """OpenAI's voice names map onto eSpeak voices that exist (two of them
    once named ``en-gb``, which eSpeak does not know, and failed mid-answer)."""
    from duplex_server.models.cascade.model import VOICES

    tts = Espeak.shared()
    openai_names = {"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse"}
    assert openai_names | {"marin", "cedar"} <= set(VOICES)
    for name, voice in VOICES.items():
        assert tts.knows_voice(voice), name
        assert len(tts.synthesize("hello", voice)) > 0, name
    assert not tts.knows_voice("en-gb+m3") and not tts.knows_voice("en-us+zz9")
