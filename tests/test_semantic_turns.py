"""semantic_vad: the pure decision (core.turns) and Smart Turn v3.2 itself
(engine/audio/smart_turn.py) on people's recorded speech.

A pause mid-sentence and the end of a sentence are cut from the same
LibriVox reading (duplex_bench/recorded_speech.py, ``scripts/fetch-speech``).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from duplex_bench import recorded_speech
from duplex_server.engine.audio import smart_turn
from duplex_server.sessions.core.turns import (
    EAGERNESS,
    Transition,
    VadGate,
    eagerness_of,
    turn_finished,
)
from protocol.session_config import TurnDetection
from tests.test_vad_gate import WINDOW, feed

SPEECH, QUIET = 0.9, 0.1
RATE = recorded_speech.SAMPLE_RATE_HZ
# "had he married a more amiable woman he might have been made still more
# respectable than he was", cut in a quiet gap between two words two thirds
# into the speech (the model's word there holds from 250 to 625 ms of pause).
SENTENCE = "amiable_woman"
CUT_S = 3.85


def semantic(eagerness: str = "auto", ask_ms: int | None = None) -> TurnDetection:
    ask = EAGERNESS[eagerness].ask_after_ms if ask_ms is None else ask_ms
    return TurnDetection(
        type="semantic_vad", threshold=0.5, silence_duration_ms=ask, eagerness=eagerness
    )


# -- the pure decision ---------------------------------------------------------


def test_eagerness_sets_threshold_and_longest_wait():
    low, medium, high = EAGERNESS["low"], EAGERNESS["medium"], EAGERNESS["high"]
    assert EAGERNESS["auto"] == medium
    assert low.threshold > medium.threshold > high.threshold
    assert low.longest_wait_ms > medium.longest_wait_ms > high.longest_wait_ms
    assert low.ask_after_ms > medium.ask_after_ms > high.ask_after_ms
    assert (low.longest_wait_ms, medium.longest_wait_ms, high.longest_wait_ms) == (8000, 4000, 2000)
    assert turn_finished(0.5, medium) and not turn_finished(0.49, medium)
    assert turn_finished(0.35, high) and not turn_finished(0.69, low)
    assert eagerness_of(TurnDetection(type="server_vad")) is None
    assert eagerness_of(TurnDetection(type="semantic_vad")) == EAGERNESS["auto"]


def test_under_semantic_vad_a_pause_asks_once_and_does_not_end_the_turn():
    vad = VadGate(semantic("auto"), WINDOW)
    assert feed(vad, 0.0, [SPEECH] * 10) == [Transition("speech_started", 0.0)]
    speech_end = 10 * WINDOW
    # 300 ms of silence is the pause that asks the model, once.
    paused = feed(vad, speech_end, [QUIET] * 20)
    assert paused == [Transition("speech_paused", speech_end)]
    assert vad.speaking  # the turn stays open
    # Speech resumes: the same utterance (no second start); a new pause asks again.
    resumed = feed(vad, speech_end + 20 * WINDOW, [SPEECH] * 5)
    assert [t.kind for t in resumed] == ["speech_sustained"]  # 400 ms since it started
    resumed_end = speech_end + 25 * WINDOW
    assert feed(vad, resumed_end, [QUIET] * 10) == [Transition("speech_paused", resumed_end)]
    # The model said finished: the hearing stops the gate at the speech's end.
    assert vad.stop() == Transition("speech_stopped", resumed_end)
    assert not vad.speaking


def test_under_semantic_vad_the_longest_wait_ends_an_unjudged_turn():
    vad = VadGate(semantic("high"), WINDOW)
    feed(vad, 0.0, [SPEECH] * 10)
    end = 10 * WINDOW
    longest = EAGERNESS["high"].longest_wait_ms
    windows = int(longest // WINDOW) + 1
    out = feed(vad, end, [QUIET] * windows)
    assert out == [Transition("speech_paused", end), Transition("speech_stopped", end)]


def test_server_vad_never_pauses():
    vad = VadGate(TurnDetection(threshold=0.5, silence_duration_ms=500), WINDOW)
    feed(vad, 0.0, [SPEECH] * 10)
    out = feed(vad, 10 * WINDOW, [QUIET] * 16)
    assert out == [Transition("speech_stopped", 10 * WINDOW)]


# -- the model on recorded speech ----------------------------------------------


@pytest.fixture(scope="module")
def clips() -> dict[str, recorded_speech.Utterance]:
    directory = recorded_speech.ensure(recorded_speech.default_dir())
    return {utterance.name: utterance for utterance in recorded_speech.load(directory)}


@pytest.fixture(scope="module")
def model() -> smart_turn.SmartTurn:
    found = smart_turn.SmartTurn.shared()
    assert found is not None, "pipecat-ai==1.14.0 (the model's wheel) is not installed"
    return found


def pause(ms: float) -> bytes:
    return b"\0\0" * int(RATE * ms / 1000)


def halves(utterance: recorded_speech.Utterance) -> tuple[bytes, bytes]:
    """The clip up to its mid-sentence cut, and the rest."""
    at = int(CUT_S * RATE) * 2
    return utterance.pcm16[:at], utterance.pcm16[at:]


def test_the_model_is_found_without_importing_pipecat(model):
    assert model.path == smart_turn.model_path()
    assert model.path.name == "smart-turn-v3.2-cpu.onnx"


def test_features_match_pipecats_own(clips):
    from pipecat.audio.turn.smart_turn._whisper_features import (
        compute_whisper_log_mel_features,
    )

    for name in (SENTENCE, recorded_speech.READING, "ten_of_clubs"):
        window = smart_turn.window_of(clips[name].pcm16, RATE)
        np.testing.assert_allclose(
            smart_turn.log_mel(window), compute_whisper_log_mel_features(window), atol=1e-5
        )


def test_a_window_keeps_the_last_8_s_zero_padded_in_front(clips):
    reading = clips[recorded_speech.READING].pcm16  # ~10 s
    window = smart_turn.window_of(reading, RATE)
    assert window.shape == (8 * RATE,)
    tail = np.frombuffer(reading, "<i2")[-8 * RATE :].astype(np.float32) / 32768.0
    np.testing.assert_array_equal(window, tail)
    short = smart_turn.window_of(clips["ten_of_clubs"].pcm16, RATE)
    samples = len(clips["ten_of_clubs"].pcm16) // 2
    assert not short[: 8 * RATE - samples].any() and short[-samples:].any()


def test_a_finished_sentence_scores_above_a_cut_off_one(clips, model):
    sentence = clips[SENTENCE]
    before, _ = halves(sentence)
    finished, cut_off = model.predict(
        [
            smart_turn.window_of(sentence.pcm16 + pause(300), RATE),
            smart_turn.window_of(before + pause(300), RATE),
        ]
    )
    auto = EAGERNESS["auto"]
    assert turn_finished(finished, auto) and finished > 0.9
    assert not turn_finished(cut_off, auto) and cut_off < 0.35


async def test_pauses_asked_together_are_batched_and_answered_alike(clips, model):
    """Sessions pausing at once share a batch; each gets its own answer, the
    same as it would alone."""
    sentence = clips[SENTENCE]
    before, _ = halves(sentence)
    asked = [sentence.pcm16 + pause(300), before + pause(300)] * 4
    alone = model.predict([smart_turn.window_of(pcm, RATE) for pcm in asked[:2]])
    together = await asyncio.gather(*(model.probability(pcm, RATE) for pcm in asked))
    assert together == pytest.approx(alone * 4, abs=1e-4)
