"""The /metrics series: quantiles read back from an exposition, and the
answer timing that feeds the listener-side histograms."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from duplex_server import metrics
from duplex_server.sessions.core.records import FenceBody, Record
from duplex_server.sessions.core.state import Response, initial_state
from duplex_server.sessions.runtime.answer_timing import UNDERRUN_GRACE_MS, AnswerTiming


def test_quantiles_interpolate_within_buckets():
    registry = CollectorRegistry()
    hist = Histogram("h", "test", buckets=(1.0, 2.0, 4.0), registry=registry)
    for value in (0.5, 1.5, 1.5, 3.0):
        hist.observe(value)
    buckets = metrics.parse_histogram(generate_latest(registry).decode(), "h")
    assert buckets == [(1.0, 1), (2.0, 3), (4.0, 4), (math.inf, 4)]
    assert metrics.histogram_quantile(buckets, 0.5) == 1.5
    assert metrics.histogram_quantile(buckets, 1.0) == 4.0
    assert metrics.histogram_quantile([(1.0, 0), (math.inf, 0)], 0.5) is None


def _count(name: str) -> float:
    registry = metrics.app_registry(dict)
    return registry.get_sample_value(name) or 0.0


def _sum(name: str) -> float:
    return _count(name.replace("_count", "_sum"))


def _answering(audio_ms: float):
    state = initial_state("sess_t", "echo", ())
    state.response = Response(id="resp_1", item_id="item_resp_1", epoch=0, modalities=["audio"])
    state.response.playback.generated_ms = audio_ms
    return state


def test_commit_to_first_audio_is_timed_from_the_commit_frame():
    name = "duplex_commit_to_first_audio_seconds_count"
    before, before_sum = _count(name), _sum(name)
    timing = AnswerTiming()
    timing.landed(_answering(0.0), [], None, now=10.0)  # the answer starts
    timing.committed(received_at=9.9)  # the frame that asked for it
    timing.landed(_answering(100.0), [], None, now=10.25)  # its first audio
    timing.landed(_answering(200.0), [], None, now=10.3)  # more: not first
    assert _count(name) == before + 1
    assert math.isclose(_sum(name) - before_sum, 0.35, abs_tol=1e-9)


def test_a_commit_during_an_answer_times_the_next_answer():
    name = "duplex_commit_to_first_audio_seconds_count"
    before = _count(name)
    timing = AnswerTiming()
    timing.landed(_answering(0.0), [], None, now=1.0)
    timing.committed(received_at=1.5)  # while resp_1 is under way
    timing.landed(_answering(100.0), [], None, now=2.0)
    assert _count(name) == before  # resp_1 answered an earlier turn
    timing.landed(initial_state("sess_t", "echo", ()), [], None, now=3.0)  # it ends
    nxt = _answering(0.0)
    assert nxt.response is not None
    nxt.response.id = "resp_2"
    timing.landed(nxt, [], None, now=3.1)
    nxt.response.playback.generated_ms = 100.0
    timing.landed(nxt, [], None, now=3.2)
    assert _count(name) == before + 1


def test_underrun_counts_audio_that_came_after_the_last_played_out():
    name = "duplex_audio_underruns_total"
    before = _count(name)
    timing = AnswerTiming()
    timing.landed(_answering(0.0), [], None, now=0.0)
    timing.landed(_answering(100.0), [], None, now=1.0)  # 100 ms start playing
    timing.landed(_answering(200.0), [], None, now=1.0 + 0.1 + UNDERRUN_GRACE_MS / 2000)
    assert _count(name) == before  # inside the grace
    timing.landed(_answering(300.0), [], None, now=1.5)  # 200 ms played by 1.2 s
    assert _count(name) == before + 1
    timing.landed(_answering(400.0), [], None, now=1.55)  # caught up again
    assert _count(name) == before + 1


def test_barge_in_to_silence_is_timed_from_the_frame_that_barged_in():
    name = "duplex_barge_in_to_silence_seconds_count"
    before = _count(name)
    fence = Record(
        epoch=0, ts_ms=0, origin="client", body=FenceBody(reason="barge_in", new_epoch=1)
    )
    AnswerTiming().landed(_answering(100.0), [fence], input_at=4.0, now=4.02)
    AnswerTiming().landed(_answering(100.0), [fence], input_at=None, now=4.02)
    assert _count(name) == before + 1
