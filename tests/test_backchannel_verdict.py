"""The backchannel rule (core/turns.py): which sustained speech over the
answer is an acknowledgement, decided by its length and its words."""

from __future__ import annotations

from duplex_server.sessions.core.turns import (
    BACKCHANNEL_WORDS,
    Backchannels,
    Transition,
    VadGate,
    normal_words,
    overlap_verdict,
)
from protocol.session_config import TurnDetection

RULE = Backchannels.parse(BACKCHANNEL_WORDS, max_ms=1000.0)


def test_words_compare_without_case_hyphens_or_punctuation():
    assert normal_words("Mm-hmm, OK.") == ["mmhmm", "ok"]
    assert RULE.all_backchannel("Mm-hmm.") is True
    assert RULE.all_backchannel("Yeah, right!") is True
    assert RULE.all_backchannel("I see") is True  # a listed phrase adds its words
    assert RULE.all_backchannel("okay but wait") is False
    assert RULE.all_backchannel(" ... ") is None  # no words: not known yet


def test_the_list_is_the_settings():
    rule = Backchannels.parse("uh-huh, sure")
    assert rule.words == {"uhhuh", "sure"}
    assert rule.all_backchannel("okay") is False
    assert not Backchannels.parse("").enabled


def test_acknowledgements_that_end_short_do_not_cut():
    assert overlap_verdict(RULE, 600.0, "okay", ended=True) == ("backchannel", "backchannel_words")


def test_other_words_cut_at_once():
    assert overlap_verdict(RULE, 450.0, "open the door", ended=False) == (
        "speech",
        "not_a_backchannel",
    )


def test_unknown_or_acknowledging_words_hold_until_the_length_decides():
    assert overlap_verdict(RULE, 450.0, None, ended=False) == ("hold", None)
    assert overlap_verdict(RULE, 900.0, "yeah", ended=False) == ("hold", None)
    assert overlap_verdict(RULE, 1000.0, None, ended=False) == ("speech", "too_long")
    assert overlap_verdict(RULE, 1000.0, "yeah yeah yeah", ended=False) == ("speech", "too_long")


def test_speech_that_ends_unheard_is_decided_by_its_length():
    assert overlap_verdict(RULE, 600.0, None, ended=True) == ("speech", "unheard")


def test_the_gate_tells_when_speech_outlasts_a_backchannel():
    settings = TurnDetection(type="server_vad", threshold=0.5, silence_duration_ms=500)
    gate = VadGate(settings, window_ms=32.0, barge_in_ms=400.0, long_ms=1000.0)
    heard = [t for end in range(32, 1400, 32) for t in gate.push(float(end), 0.9)]
    assert [t.kind for t in heard] == ["speech_started", "speech_sustained", "speech_long"]
    assert heard[2] == Transition("speech_long", 1024.0)
    # without a long threshold, as before
    gate = VadGate(settings, window_ms=32.0, barge_in_ms=400.0)
    heard = [t for end in range(32, 1400, 32) for t in gate.push(float(end), 0.9)]
    assert [t.kind for t in heard] == ["speech_started", "speech_sustained"]
