"""``duplex-server bench webrtc`` run small end to end, as a user would: two
aiortc calls and two WebSocket sessions, each path on its own cascade
server, saying the same recordings. The figures are checked against each
other and against what was sent (the answers heard on the calls' tracks,
their outbound frames counted by the server), never against a clock."""

from __future__ import annotations

import pytest

from duplex_bench import recorded_speech, wer
from tests.e2e.test_bench_cli import bench

CALLS, TURNS = 2, 1
PATHS = ("webrtc", "websocket")


@pytest.fixture(scope="module")
def report() -> dict:
    return bench("webrtc", "--calls", str(CALLS), "--turns", str(TURNS), "--ramp-s", "0.5")


def test_the_run_says_what_it_ran_and_whether_it_is_valid(report):
    assert report["bench"] == "webrtc"
    assert (report["calls"], report["turns_per_call"], report["model"]) == (
        CALLS,
        TURNS,
        "cascade",
    )
    assert report["speech"]["sha256"] == recorded_speech.SDIST_SHA256
    assert report["valid"] == (not report["invalid_reasons"])
    assert report["invalid_reason"] == (report["invalid_reasons"] or [None])[0]


@pytest.mark.parametrize("path", PATHS)
def test_every_call_connected_and_every_turn_was_answered_and_heard(report, path):
    figures = report[path]
    assert figures["call_errors"] == []
    assert figures["calls_connected"] == CALLS
    assert 1 <= figures["calls_at_once_max"] <= CALLS
    transcripts = figures["transcripts"]
    assert figures["turns"] == len(transcripts) == CALLS * TURNS
    # answered: on the call, its answer's audio was heard on the track
    assert figures["turns_answered"] == CALLS * TURNS
    names = [script.name for script in recorded_speech.SCRIPTS[:CALLS]]
    assert sorted(t["utterance"] for t in transcripts) == sorted(names)
    for turn in transcripts:
        assert turn["word_errors"] == wer.score(turn["reference"], turn["heard"]).errors
        assert turn["voice_to_voice_ms"] > 0
    assert figures["reference_words"] == sum(len(wer.words(t["reference"])) for t in transcripts)
    assert figures["word_error_rate"] < 0.5  # the recordings arrived whole
    v2v = figures["voice_to_voice_ms"]
    assert v2v["n"] == CALLS * TURNS and 0 < v2v["p50"] <= v2v["p95"]
    assert figures["server_cpu_s"] > 0
    assert figures["server_cpu_s_per_call_second"] == pytest.approx(
        figures["server_cpu_s"] / figures["call_seconds"], rel=0.05
    )
    processes = figures["generator_processes"]
    assert sum(p["sessions"] for p in processes) == CALLS
    assert figures["generator_cpu_percent"] == max(p["busy_percent"] for p in processes)
    assert figures["audio_late_ms_max"] >= 0


def test_the_server_paced_the_answers_frames(report):
    frames = report["webrtc"]["outbound_frames"]
    # every call's track ran for seconds: 50 frames a second each
    assert frames["frames"] >= CALLS * 50
    assert 0 <= frames["lateness_ms_p50"] <= frames["lateness_ms_p99"]
    assert frames["underruns"] >= 0
    assert "outbound_frames" not in report["websocket"]


def test_the_comparison_and_targets_follow_from_the_figures(report):
    rtc, socket = report["webrtc"], report["websocket"]
    comparison, targets = report["webrtc_vs_websocket"], report["targets"]
    ratio = rtc["server_cpu_s_per_call_second"] / socket["server_cpu_s_per_call_second"]
    assert comparison["cpu_per_call_ratio"] == pytest.approx(ratio, abs=1e-3)
    assert comparison["word_error_rate_difference"] == pytest.approx(
        rtc["word_error_rate"] - socket["word_error_rate"], abs=1e-4
    )
    assert comparison["voice_to_voice_p50_difference_ms"] == pytest.approx(
        rtc["voice_to_voice_ms"]["p50"] - socket["voice_to_voice_ms"]["p50"], abs=0.2
    )
    frames = rtc["outbound_frames"]
    assert targets == {
        "at_least_50_calls_at_once": rtc["calls_at_once_max"] >= 50,
        "outbound_lateness_p99_under_20ms": frames["lateness_ms_p99"] < 20,
        "no_underruns": frames["underruns"] == 0,
        "cpu_per_call_at_most_2x_websocket": comparison["cpu_per_call_ratio"] <= 2,
    }
    assert targets["at_least_50_calls_at_once"] is False  # two calls
