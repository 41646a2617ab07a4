"""The server VAD gate (core.turns.VadGate): scored windows in, transitions out.

Pure and clockless: every time below is a point on the input timeline, so the
expectations follow from MIN_SPEECH_MS, BARGE_IN_MS and the session's
threshold and silence_duration_ms alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from duplex_server.sessions.core.turns import BARGE_IN_MS, MIN_SPEECH_MS, Transition, VadGate
from protocol.session_config import TurnDetection

WINDOW = 32.0  # ms per scored window (Silero's 512 samples at 16 kHz)
THRESHOLD = 0.5
SILENCE = 500
SPEECH, QUIET = 0.9, 0.1


def gate(threshold: float = THRESHOLD, silence_ms: int = SILENCE) -> VadGate:
    return VadGate(TurnDetection(threshold=threshold, silence_duration_ms=silence_ms), WINDOW)


def feed(vad: VadGate, start_ms: float, probabilities: Iterable[float]) -> list[Transition]:
    """Push consecutive windows, the first one starting at ``start_ms``."""
    out: list[Transition] = []
    end = start_ms
    for probability in probabilities:
        end += WINDOW
        out.extend(vad.push(end, probability))
    return out


def test_the_constants_the_expectations_rest_on():
    # Two 32 ms windows are exactly MIN_SPEECH_MS; 13 reach BARGE_IN_MS, 12 do not.
    assert MIN_SPEECH_MS == 2 * WINDOW
    assert 12 * WINDOW < BARGE_IN_MS <= 13 * WINDOW


def test_a_single_window_of_speech_is_not_a_turn():
    vad = gate()
    assert vad.push(WINDOW, SPEECH) == []
    assert not vad.speaking
    assert vad.push(2 * WINDOW, QUIET) == []  # the click ends: the run is gone
    assert vad.push(3 * WINDOW, SPEECH) == []  # a new run: one window again
    assert not vad.speaking


def test_speech_starts_once_min_speech_ms_are_heard_in_a_row():
    vad = gate()
    assert vad.push(1000 + WINDOW, SPEECH) == []
    # 64 ms of speech: started, dated at the start of the first speech window
    assert vad.push(1000 + 2 * WINDOW, SPEECH) == [Transition("speech_started", 1000.0)]
    assert vad.speaking
    assert vad.push(1000 + 3 * WINDOW, SPEECH) == []  # no second start


def test_a_quiet_window_inside_the_first_min_speech_ms_resets_the_run():
    vad = gate()
    out = feed(vad, 0.0, [SPEECH, QUIET, SPEECH, QUIET, SPEECH, SPEECH])
    # windows end at 32..192; the only two in a row are 128-160 and 160-192
    assert out == [Transition("speech_started", 4 * WINDOW)]


def test_the_threshold_is_inclusive():
    at = gate(threshold=0.6)
    assert feed(at, 0.0, [0.6, 0.6]) == [Transition("speech_started", 0.0)]

    below = gate(threshold=0.6)
    assert feed(below, 0.0, [0.5999, 0.5999, 0.5999, 0.5999]) == []
    assert not below.speaking

    above = gate(threshold=0.6)
    assert feed(above, 0.0, [0.61, 0.61]) == [Transition("speech_started", 0.0)]


def test_a_probability_just_below_the_threshold_counts_as_silence_while_speaking():
    vad = gate(threshold=0.6, silence_ms=64)
    feed(vad, 0.0, [0.9, 0.9])  # started at 0, last speech ends at 64
    assert vad.push(3 * WINDOW, 0.5999) == []  # 32 ms of quiet: not yet
    assert vad.push(4 * WINDOW, 0.5999) == [Transition("speech_stopped", 2 * WINDOW)]


def test_silence_duration_ends_the_turn_at_the_end_of_the_last_speech_window():
    vad = gate(silence_ms=SILENCE)
    assert feed(vad, 0.0, [SPEECH] * 5) == [Transition("speech_started", 0.0)]
    last_speech_end = 5 * WINDOW  # 160
    out: list[Transition] = []
    end = last_speech_end
    while not out:
        end += WINDOW
        out = vad.push(end, QUIET)
    assert out == [Transition("speech_stopped", last_speech_end)]
    # the first quiet window at least SILENCE ms after the speech ended: 672, not 640
    assert end == 672.0
    assert end - last_speech_end >= SILENCE > end - WINDOW - last_speech_end
    assert not vad.speaking


def test_a_pause_shorter_than_the_silence_duration_does_not_end_the_turn():
    vad = gate(silence_ms=SILENCE)
    out = feed(vad, 0.0, [SPEECH] * 3 + [QUIET] * 15 + [SPEECH] + [QUIET] * 16)
    # speech 0-96, 480 ms of quiet (< 500), speech 576-608, then quiet until 1120
    assert [t.kind for t in out] == ["speech_started", "speech_sustained", "speech_stopped"]
    assert out[0] == Transition("speech_started", 0.0)
    assert out[-1] == Transition("speech_stopped", 19 * WINDOW)  # 608: after the resumption


def test_quiet_while_not_speaking_never_stops_anything():
    vad = gate()
    assert feed(vad, 0.0, [QUIET] * 40) == []


def test_speech_sustained_once_per_utterance_after_barge_in_ms():
    vad = gate()
    out = feed(vad, 0.0, [SPEECH] * 40)  # 1280 ms of speech from 0
    assert out == [
        Transition("speech_started", 0.0),
        Transition("speech_sustained", 13 * WINDOW),  # 416: the first end >= 400 ms in
    ]


def test_short_speech_stops_without_being_sustained():
    vad = gate(silence_ms=SILENCE)
    out = feed(vad, 0.0, [SPEECH] * 12 + [QUIET] * 16)  # 384 ms < BARGE_IN_MS
    assert out == [
        Transition("speech_started", 0.0),
        Transition("speech_stopped", 12 * WINDOW),
    ]


def test_sustained_counts_from_the_start_of_the_utterance_through_short_pauses():
    vad = gate(silence_ms=SILENCE)
    # speech 0-192, quiet 192-384 (shorter than SILENCE), speech again from 384
    out = feed(vad, 0.0, [SPEECH] * 6 + [QUIET] * 6 + [SPEECH] * 3)
    assert out == [
        Transition("speech_started", 0.0),
        Transition("speech_sustained", 13 * WINDOW),  # 416 ms after the start
    ]


def test_a_second_utterance_after_a_stop_starts_afresh():
    vad = gate(silence_ms=SILENCE)
    first = feed(vad, 0.0, [SPEECH] * 20 + [QUIET] * 16)
    assert [t.kind for t in first] == ["speech_started", "speech_sustained", "speech_stopped"]
    assert first[-1].at_ms == 20 * WINDOW

    second_start = 36 * WINDOW  # 1152: where the first feed left off
    # one window alone is still a click, even right after an utterance
    assert vad.push(second_start + WINDOW, SPEECH) == []
    assert vad.push(second_start + 2 * WINDOW, QUIET) == []
    again = feed(vad, second_start + 2 * WINDOW, [SPEECH] * 20 + [QUIET] * 16)
    begin = second_start + 2 * WINDOW
    assert again == [
        Transition("speech_started", begin),
        Transition("speech_sustained", begin + 13 * WINDOW),  # sustained again, once
        Transition("speech_stopped", begin + 20 * WINDOW),
    ]


def test_zero_silence_duration_stops_at_the_first_quiet_window():
    vad = gate(silence_ms=0)
    out = feed(vad, 0.0, [SPEECH, SPEECH, SPEECH, QUIET])
    assert out == [
        Transition("speech_started", 0.0),
        Transition("speech_stopped", 3 * WINDOW),
    ]
