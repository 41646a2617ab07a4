"""``duplex-server bench turns`` run tiny end to end, as a user would: two
labelled turns (one with a pause cut in, one clean) under server_vad and
one semantic_vad eagerness, and one acknowledgement and one interruption
over an answer under each. The figures are checked against each other and
against the labels, never against a clock."""

from __future__ import annotations

import pytest

from duplex_bench import recorded_speech, turn_clips
from tests.e2e.test_bench_cli import bench

TURNS, MISSED_AFTER_S = 2, 2.0
PHASES = ["server_vad_500ms", "semantic_vad_high"]


@pytest.fixture(scope="module")
def report() -> dict:
    return bench(
        *("turns", "--speakers", "2", "--turns", str(TURNS), "--eagerness", "high"),
        *("--overlaps", "1", "--missed-after-s", str(MISSED_AFTER_S)),
    )


@pytest.fixture(scope="module")
def labelled() -> list[turn_clips.LabelledTurn]:
    utterances = recorded_speech.load(recorded_speech.default_dir())
    return turn_clips.build(utterances, TURNS, 0)


def test_the_run_names_its_detections_speech_and_verdict(report):
    assert report["bench"] == "turns" and report["baseline"] == PHASES[0]
    assert list(report["phases"]) == list(report["detections"]) == PHASES
    assert report["speech"]["sha256"] == recorded_speech.SDIST_SHA256
    assert report["speech"]["paused_turns"] == 1
    assert report["valid"] == (not report["invalid_reasons"])
    assert set(report["ratios_vs_baseline"]) == {"semantic_vad_high"}
    targets = report["targets"]
    assert set(targets["eagerness_at_same_median_delay"]) <= {"semantic_vad_high"}
    assert set(targets["eagerness_meeting_a_third_as_many_early"]) <= set(
        targets["eagerness_at_same_median_delay"]
    )
    assert all(isinstance(v, bool) for k, v in targets.items() if not k.startswith("eagerness"))


def test_the_turns_are_cut_where_the_labels_say(labelled):
    paused, clean = labelled
    assert paused.paused and not clean.paused
    start, end = paused.pauses[0]
    low, high = turn_clips.PAUSE_MS
    assert low <= end - start <= high
    assert start + turn_clips.CUT_MARGIN_MS[1] <= paused.speech_end_ms
    # the pause was added to the recording, no more
    source = next(
        u for u in recorded_speech.load(recorded_speech.default_dir()) if u.name == paused.source
    )
    added = sum(b - a for a, b in paused.pauses)
    assert paused.speech_end_ms == pytest.approx(source.speech_end_s * 1000 + added)
    assert paused.seconds == pytest.approx(source.seconds + added / 1000, abs=0.021)


@pytest.mark.parametrize("phase", PHASES)
def test_every_turn_is_classified_and_the_counts_add_up(report, labelled, phase):
    figures = report["phases"][phase]
    per_turn = figures["per_turn"]
    assert figures["turns"] == len(per_turn) == TURNS
    assert sorted(t["name"] for t in per_turn) == sorted(t.name for t in labelled)
    assert figures["early_turns"] == sum(t["early_stops"] > 0 for t in per_turn)
    assert figures["early_turns"] == figures["early_turns_paused"] + figures["early_turns_clean"]
    assert figures["early_stops"] == sum(t["early_stops"] for t in per_turn)
    assert figures["early_stops_at_inserted_pause"] <= figures["early_stops"]
    assert figures["missed_turns"] == sum(t["missed"] for t in per_turn)
    for turn in per_turn:
        # a stop before the end counted early is one of the stops the server sent
        assert turn["early_stops"] <= len(turn["stops_audio_end_ms"])
        if not turn["missed"]:
            assert turn["delay_ms"] <= MISSED_AFTER_S * 1000
    decided = [t for t in per_turn if not t["missed"]]
    delay = figures["end_of_turn_delay_ms"]
    assert delay["n"] == len(decided)
    if decided:
        assert delay["p50"] <= delay["p90"] <= delay["p99"]
    # the clean card name ends the turn under any detection: no early stop, none missed
    clean = next(t for t in per_turn if not t["pauses_ms"])
    assert clean["early_stops"] == 0 and not clean["missed"]
    assert figures["appends_sent"] > 0 and figures["appends_refused"] >= 0
    assert figures["generator_cpu_percent"] >= 0


def test_only_semantic_vad_asks_the_end_of_turn_model(report):
    assert report["phases"]["server_vad_500ms"]["decision"]["judged"] == 0
    decision = report["phases"]["semantic_vad_high"]["decision"]
    assert decision["judged"] >= 1 and 0 < decision["p50_ms"] <= decision["p99_ms"]


@pytest.mark.parametrize("detection", ["server_vad_500ms", "semantic_vad"])
def test_each_overlap_is_judged_on_the_answer_it_talked_over(report, detection):
    overlaps = report["backchannels"][detection]
    trials = overlaps["trials"]
    assert [t["kind"] for t in trials] == ["acknowledgement", "interruption"]
    assert overlaps["unanswered"] == sum(t["status"] is None for t in trials) == 0
    for trial in trials:
        assert trial["cut"] == (trial["truncated"] or trial["status"] != "completed")
    assert overlaps["acknowledgements_that_cut"] == sum(
        t["cut"] for t in trials if t["kind"] == "acknowledgement"
    )
    assert overlaps["interruptions_that_did_not_cut"] == sum(
        not t["cut"] and t["judged"] for t in trials if t["kind"] == "interruption"
    )
    # unjudged only where the answer ended while the words were awaited, uncut
    assert overlaps["interruptions_unjudged"] == sum(
        not t["judged"] for t in trials if t["kind"] == "interruption"
    )
    for trial in trials:
        assert trial["judged"] == (trial["cut"] or "answer_ended" not in trial["overlap_reasons"])
    # a whole sentence over the answer is a barge-in today and after backchannels land
    assert overlaps["interruptions_that_did_not_cut"] == 0
