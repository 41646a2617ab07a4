"""What ``bench voice`` scores and speaks: the word error rate, and the
recorded speech (pinned files, where each speaker stops)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from duplex_bench import recorded_speech, wer


def test_spellings_that_mean_the_same_words_are_not_errors():
    assert wer.words("Go forward 10 meters.") == ["go", "forward", "ten", "meters"]
    assert wer.words("And Mr. John Dashwood, cold-hearted") == wer.words(
        "and mister john dashwood cold hearted"
    )
    assert wer.words("42 or 305") == ["forty", "two", "or", "three", "hundred", "five"]
    assert wer.score("go forward ten meters", "Go forward 10 meters.").errors == 0


def test_each_substitution_deletion_and_insertion_is_one_error():
    assert wer.edit_distance(["a", "b", "c"], ["a", "x", "c"]) == 1
    assert wer.edit_distance(["a", "b", "c"], ["a", "c"]) == 1
    assert wer.edit_distance(["a", "b", "c"], ["a", "b", "y", "c"]) == 1
    assert wer.edit_distance(["a", "b"], []) == 2
    assert wer.edit_distance([], ["a", "b"]) == 2
    # a recogniser that repeats itself is charged for every invented word
    repeated = wer.score("ten of clubs", "10 of clubs 10 of clubs 10 of clubs")
    assert (repeated.errors, repeated.reference_words, repeated.rate) == (6, 3, 2.0)


def test_a_pooled_rate_weighs_utterances_by_their_words():
    scores = [wer.score("one two three four", "one two three four"), wer.score("five", "six")]
    assert wer.total(scores) == wer.Score(1, 5)
    assert wer.total(scores).rate == pytest.approx(0.2)
    assert wer.Score(0, 0).rate is None


def test_speech_ends_where_the_speaker_stops_not_where_the_clip_does():
    rate = recorded_speech.SAMPLE_RATE_HZ
    t = np.arange(rate) / rate
    tone = (np.sin(2 * np.pi * 300 * t) * 8000).astype("<i2")
    hiss = (np.random.default_rng(0).normal(0, 30, rate // 2)).astype("<i2")  # 48 dB down
    pcm = np.concatenate([hiss, tone, hiss]).tobytes()
    assert recorded_speech.speech_end_s(pcm) == pytest.approx(1.5, abs=0.02)


@pytest.fixture(scope="module")
def speech_dir():
    return recorded_speech.ensure(recorded_speech.default_dir())


def test_the_recordings_are_people_reading_their_references(speech_dir):
    utterances = recorded_speech.load(speech_dir)
    assert [u.name for u in utterances] == [s.name for s in recorded_speech.SCRIPTS]
    reading = utterances[0]
    assert reading.name == recorded_speech.READING and 9.5 < reading.seconds < 11.0
    for utterance in utterances:
        assert 0.5 < utterance.speech_end_s <= utterance.seconds
        samples = np.frombuffer(utterance.pcm16, "<i2")
        assert np.abs(samples).max() > 3000  # a voice, not silence
    assert len(utterances) >= 8


def test_a_recording_that_is_not_the_pinned_file_is_refused(speech_dir, tmp_path):
    copy = tmp_path / "speech"
    shutil.copytree(speech_dir, copy)
    clip = copy / recorded_speech.SCRIPTS[1].files[0]
    data = bytearray(clip.read_bytes())
    data[-1] ^= 0xFF
    clip.write_bytes(bytes(data))
    with pytest.raises(recorded_speech.SpeechMissing, match="not the pinned recording"):
        recorded_speech.load(copy)
    clip.unlink()
    with pytest.raises(recorded_speech.SpeechMissing, match="missing"):
        recorded_speech.load(copy)
