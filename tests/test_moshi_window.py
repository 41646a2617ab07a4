"""Contexts longer than the temporal transformer's sliding window, on a tiny
random Moshi whose window is a few frames: past the window the batched rows
still equal each row alone (a late joiner included) and the cache stops
growing; a row rebuilt from only the last window of logged frames continues
the same in a batch whose shared timeline is long past the window as it
does alone. (A server resume prefills the whole call's log, not a window:
only that continues the uninterrupted call, ``tests/test_moshi_long_call.py``
and ``tests/e2e/test_moshi_resume.py``.)"""

from __future__ import annotations

import numpy as np
import pytest

from duplex_bench.tiny_moshi import FRAME_SAMPLES, float64_moshi, frame, noise_signals, tiny_moshi
from duplex_server.engine.duplex.checkpoint import check_moshi_checkpoint
from duplex_server.engine.duplex.stepper import DuplexStepper

WINDOW = 5
FRAMES = 3 * WINDOW


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_moshi(tmp_path_factory.mktemp("moshi-window"), window=WINDOW)


@pytest.fixture(scope="module")
def model(checkpoint):
    return float64_moshi(checkpoint)


@pytest.fixture(scope="module")
def voices():
    return noise_signals(17, 2, 2 * FRAMES * FRAME_SAMPLES)


@pytest.fixture(scope="module")
def solo(model, voices):
    stepper = DuplexStepper(model, rows=1)
    row = stepper.join()
    return [stepper.tick({row: frame(voices[0], i)})[row] for i in range(FRAMES)]


def assert_same_frames(got, expected):
    assert [f.tokens for f in got] == [f.tokens for f in expected]
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_allclose(mine.samples, theirs.samples, rtol=0, atol=1e-6)


def cached_positions(stepper: DuplexStepper) -> set[int]:
    return {layer.keys.shape[-2] for layer in stepper.cache.layers if layer.keys is not None}


def test_the_checkpoint_says_its_window(checkpoint):
    assert check_moshi_checkpoint(str(checkpoint)).window == WINDOW


def test_past_the_window_a_late_joiner_equals_the_row_alone(model, voices, solo):
    late = WINDOW + 2  # the batch's timeline is past the window when it joins
    stepper = DuplexStepper(model, rows=2)
    first = stepper.join()
    joined = []
    for index in range(late + FRAMES):
        inputs = {first: frame(voices[1], index)}
        if index == late:
            second = stepper.join()
        if index >= late:
            inputs[second] = frame(voices[0], index - late)
            joined.append(stepper.tick(inputs)[second])
        else:
            stepper.tick(inputs)
    assert_same_frames(joined, solo)
    assert cached_positions(stepper) == {WINDOW - 1}  # the cache stopped growing


def test_a_row_rebuilt_from_the_last_window_continues_alike_in_any_batch(model, voices, solo):
    """The prefill reads only the last ``WINDOW`` logged frames; the rebuilt
    row spliced into a batch long past the window computes what it computes
    rebuilt alone (its context is that window: what came before it is gone)."""
    logged = 2 * WINDOW + 1
    history = [(frame(voices[0], i), solo[i].tokens) for i in range(logged)][-WINDOW:]

    def continued(stepper: DuplexStepper, row: int, other: int | None) -> list:
        out = []
        for index in range(logged, FRAMES):
            inputs = {row: frame(voices[0], index)}
            if other is not None:
                inputs[other] = frame(voices[1], index)
            out.append(stepper.tick(inputs)[row])
        return out

    alone = DuplexStepper(model, rows=1)
    expected = continued(alone, alone.resume(history), None)

    busy = DuplexStepper(model, rows=2)
    other = busy.join()
    for index in range(2 * WINDOW + 3):
        busy.tick({other: frame(voices[1], index)})
    got = continued(busy, busy.resume(history), other)

    assert_same_frames(got, expected)
    assert cached_positions(busy) == {WINDOW - 1}
    assert all(f.samples.any() for f in got)  # it speaks on
