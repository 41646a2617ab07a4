"""``duplex-server bench voice`` run small end to end, as a user would: two
recognisers side by side on real server processes, recorded speech in 20 ms
appends. The figures are checked against each other and against what was
sent, never against a clock."""

from __future__ import annotations

import pytest

from duplex_bench import recorded_speech, wer
from tests.e2e.test_bench_cli import bench

SESSIONS, TURNS = 2, 1


@pytest.fixture(scope="module")
def report() -> dict:
    return bench(
        *("voice", "--sessions", str(SESSIONS), "--turns", str(TURNS)),
        *("--asr", "pocketsphinx,auto"),
    )


def test_each_recogniser_ran_on_its_own_server_with_the_recorded_speech(report):
    assert report["bench"] == "voice" and report["baseline"] == "pocketsphinx"
    assert list(report["recognisers"]) == ["pocketsphinx", "auto"]
    assert report["speech"]["sha256"] == recorded_speech.SDIST_SHA256
    assert report["speech"]["utterances"] == len(recorded_speech.SCRIPTS)
    assert report["valid"] == (not report["invalid_reasons"])


@pytest.mark.parametrize("asr", ["pocketsphinx", "auto"])
def test_every_turn_sent_is_counted_transcribed_and_scored(report, asr):
    phase = report["recognisers"][asr]
    scripts = {script.name: script for script in recorded_speech.SCRIPTS}
    transcripts = phase["transcripts"]
    assert phase["turns"] == len(transcripts) == SESSIONS * TURNS
    # session i says the i-th utterance first: the reading, then the first card
    assert [(t["session"], t["utterance"]) for t in transcripts] == [
        (i, recorded_speech.SCRIPTS[i].name) for i in range(SESSIONS)
    ]
    for turn in transcripts:
        assert turn["reference"] == scripts[turn["utterance"]].reference
        assert turn["word_errors"] == wer.score(turn["reference"], turn["heard"]).errors
    words = sum(len(wer.words(t["reference"])) for t in transcripts)
    errors = sum(t["word_errors"] for t in transcripts)
    assert (phase["reference_words"], phase["word_errors"]) == (words, errors)
    assert phase["word_error_rate"] == pytest.approx(errors / words, abs=1e-4)
    assert phase["misheard_turns"] == sum(t["word_errors"] > 0 for t in transcripts)
    # the audio arrived whole: most of the reading was heard right
    reading = next(t for t in transcripts if t["utterance"] == recorded_speech.READING)
    assert reading["word_errors"] < len(wer.words(reading["reference"])) / 2
    assert phase["alone_transcripts"][0]["utterance"] == recorded_speech.READING


@pytest.mark.parametrize("asr", ["pocketsphinx", "auto"])
def test_latencies_refusals_heartbeats_and_stage_times_are_measured(report, asr):
    phase = report["recognisers"][asr]
    answered = [t for t in phase["transcripts"] if t["answered"]]
    assert phase["turns_answered"] == len(answered)
    latency = phase["speech_end_to_first_audio_ms"]
    assert latency["n"] == len(answered)
    if answered:
        assert 0 < latency["p50"] <= latency["p95"]
        assert all(t["speech_end_to_first_audio_ms"] > 0 for t in answered)
    # every session sent its utterance's length in 20 ms appends, and more
    assert len(phase["appends_sent_per_session"]) == SESSIONS
    utterances = recorded_speech.load(recorded_speech.default_dir())
    for session, sent in enumerate(phase["appends_sent_per_session"]):
        assert sent >= utterances[session].seconds / 0.020
    refused = phase["appends_refused_per_session"]
    assert len(refused) == SESSIONS and all(n >= 0 for n in refused)
    assert sum(phase["appends_refused_why"].values()) == sum(refused)
    heartbeat = phase["heartbeat_rtt_ms"]
    assert heartbeat["n"] > 0 and 0 < heartbeat["p50"] <= heartbeat["p99"] <= heartbeat["max"]
    for name, stage in phase["stage_metrics_ms"].items():
        assert name.endswith("_ms") and stage["n"] > 0 and 0 <= stage["p50"] <= stage["p95"]
    assert phase["asr_rtf"] > 0 and phase["tts_rtf"] > 0
    assert phase["rtf_under_load"]["asr"] > 0 and phase["rtf_under_load"]["tts"] > 0
    assert phase["server_cpu_percent"] > 0 and phase["generator_cpu_percent"] >= 0


def test_the_targets_and_ratios_follow_from_the_figures(report):
    base, ours = report["recognisers"]["pocketsphinx"], report["recognisers"]["auto"]
    ratios = report["ratios_vs_baseline"]["auto"]
    for q in ("p50", "p95"):
        a, b = ours["speech_end_to_first_audio_ms"][q], base["speech_end_to_first_audio_ms"][q]
        assert ratios[f"speech_end_to_first_audio_{q}"] == pytest.approx(a / b, abs=1e-3)
    assert ratios["asr_rtf"] == pytest.approx(ours["asr_rtf"] / base["asr_rtf"], abs=1e-3)
    targets = report["targets"]
    latency = ours["speech_end_to_first_audio_ms"]
    assert targets["asr"] == "auto"
    assert targets["no_audio_refused"] == (sum(ours["appends_refused_per_session"]) == 0)
    assert targets["heartbeat_p99_under_100ms"] == (
        ours["heartbeat_rtt_ms"]["p99"] < 100 and ours["heartbeat_rtt_ms"]["lost"] == 0
    )
    assert targets["speech_end_to_first_audio_p50_at_most_700ms"] == (latency["p50"] <= 700)
    assert targets["speech_end_to_first_audio_p95_at_most_1000ms"] == (latency["p95"] <= 1000)
    assert targets["every_turn_answered"] == (ours["turns_answered"] == ours["turns"])
