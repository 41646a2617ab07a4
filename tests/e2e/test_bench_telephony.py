"""``duplex-server bench telephony`` run small end to end, as a user would: one
simulated Twilio call and one WebSocket session, each on its own cascade
server, saying the same recording. The figures are checked against each
other and against what was sent, never against a clock."""

from __future__ import annotations

import pytest

from duplex_bench import recorded_speech, wer
from tests.e2e.test_bench_cli import bench

CALLS, TURNS = 1, 1
PATHS = ("phone", "websocket")


@pytest.fixture(scope="module")
def report() -> dict:
    return bench("telephony", "--calls", str(CALLS), "--turns", str(TURNS))


def test_the_run_says_what_it_ran_and_whether_it_is_valid(report):
    assert report["bench"] == "telephony"
    assert (report["calls"], report["turns_per_call"]) == (CALLS, TURNS)
    assert report["speech"]["sha256"] == recorded_speech.SDIST_SHA256
    assert report["valid"] == (not report["invalid_reasons"])
    assert report["invalid_reason"] == (report["invalid_reasons"] or [None])[0]


@pytest.mark.parametrize("path", PATHS)
def test_every_turn_was_said_transcribed_scored_and_timed(report, path):
    figures = report[path]
    transcripts = figures["transcripts"]
    # the phone path really ran: a turn per call and utterance, each answered
    assert figures["turns"] == len(transcripts) == CALLS * TURNS
    assert figures["turns_answered"] == CALLS * TURNS
    assert [t["utterance"] for t in transcripts] == [recorded_speech.SCRIPTS[0].name]
    for turn in transcripts:
        assert turn["word_errors"] == wer.score(turn["reference"], turn["heard"]).errors
        assert turn["voice_to_voice_ms"] > 0
    words = sum(len(wer.words(t["reference"])) for t in transcripts)
    assert figures["reference_words"] == words
    assert 0 <= figures["word_error_rate"] <= 1
    assert figures["word_error_rate"] == pytest.approx(figures["word_errors"] / words, abs=1e-4)
    # the recording arrived whole: most of it was heard right
    assert figures["word_error_rate"] < 0.5
    v2v = figures["voice_to_voice_ms"]
    assert v2v["n"] == CALLS * TURNS and 0 < v2v["p50"] <= v2v["p95"]
    assert figures["server_cpu_s"] > 0 and figures["call_seconds"] > 0
    assert figures["server_cpu_s_per_call_second"] == pytest.approx(
        figures["server_cpu_s"] / figures["call_seconds"], rel=0.05
    )
    assert figures["generator_cpu_percent"] >= 0
    assert isinstance(figures["generator_saturated"], bool)
    assert figures["audio_late_ms_max"] >= 0


def test_the_comparison_and_targets_follow_from_the_figures(report):
    phone, socket = report["phone"], report["websocket"]
    comparison, targets = report["phone_vs_websocket"], report["targets"]
    cpu_ratio = phone["server_cpu_s_per_call_second"] / socket["server_cpu_s_per_call_second"]
    wer_difference = phone["word_error_rate"] - socket["word_error_rate"]
    v2v_difference = phone["voice_to_voice_ms"]["p50"] - socket["voice_to_voice_ms"]["p50"]
    assert comparison["cpu_per_call_ratio"] == pytest.approx(cpu_ratio, abs=1e-3)
    assert comparison["word_error_rate_difference"] == pytest.approx(wer_difference, abs=1e-4)
    assert comparison["voice_to_voice_p50_difference_ms"] == pytest.approx(v2v_difference, abs=0.2)
    assert targets == {
        "word_error_rate_within_0.1_of_websocket": abs(comparison["word_error_rate_difference"])
        <= 0.1,
        "cpu_per_call_at_most_1.2x_websocket": comparison["cpu_per_call_ratio"] <= 1.2,
        "voice_to_voice_p50_within_50ms_of_websocket": abs(
            comparison["voice_to_voice_p50_difference_ms"]
        )
        <= 50,
    }
