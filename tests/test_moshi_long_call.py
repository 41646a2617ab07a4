"""A call several temporal windows long on a tiny random Moshi whose window
is 5 frames (Moshi's is 3,000: 4 minutes): the fast step's ring and its
static codec wrap many times and still speak exactly as the eager step's
sliding caches do, every frame in turn (no cut at a wrap), in state that
stops growing; and a row rebuilt from its whole log after the wrap (a
teacher-forced prefill, a window of frames a forward, not a replay tick by
tick) continues the uninterrupted call token for token, primed or not."""

from __future__ import annotations

import numpy as np
import pytest

from duplex_bench.tiny_moshi import noise_frames, tiny_moshi, windowed
from duplex_server.engine.duplex.fast_step import FastDuplexStepper
from duplex_server.engine.duplex.prime import prime_frames
from duplex_server.engine.duplex.prompt_codec import encode_frames, prompt_codes
from duplex_server.engine.duplex.stepper import DuplexStepper

WINDOW = 5
TICKS = 5 * WINDOW + 2  # the ring wraps five times


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return windowed(tiny_moshi(tmp_path_factory.mktemp("moshi-long")), WINDOW)


@pytest.fixture(scope="module")
def signals():
    return noise_frames(31, streams=2, ticks=TICKS)


def call(stepper, signals, ticks=TICKS):
    """Stream 0 from the first tick, stream 1 joining at tick 3: each one's frames."""
    first = stepper.join()
    out: dict[int, list] = {0: [], 1: []}
    second = None
    for tick in range(ticks):
        if tick == 3:
            second = stepper.join()
        inputs = {first: signals[0][tick]}
        if second is not None:
            inputs[second] = signals[1][tick - 3]
        frames = stepper.tick(inputs)
        out[0].append(frames[first])
        if second is not None:
            out[1].append(frames[second])
    return out


@pytest.fixture(scope="module")
def eager(model, signals):
    return call(DuplexStepper(model, rows=2), signals)


def assert_same(got, expected):
    assert [f.step for f in got] == [f.step for f in expected]
    assert [f.tokens for f in got] == [f.tokens for f in expected]
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_allclose(mine.samples, theirs.samples, rtol=0, atol=1e-9)


def test_a_long_call_on_the_fast_step_equals_the_eager_step_across_every_wrap(
    model, signals, eager
):
    stepper = FastDuplexStepper(model, rows=2)
    shapes = (stepper.keys.shape, stepper.encoder.ring.keys.shape, stepper.decoder.ring.keys.shape)
    fast = call(stepper, signals)
    for stream in (0, 1):
        assert_same(fast[stream], eager[stream])
        steps = [f.step for f in fast[stream]]
        assert steps == list(range(len(steps)))  # every frame in turn
        assert all(f.samples.any() for f in fast[stream][1:])  # it speaks on through each wrap
    assert len(fast[0]) == TICKS > 5 * WINDOW
    shapes_after = (
        stepper.keys.shape,
        stepper.encoder.ring.keys.shape,
        stepper.decoder.ring.keys.shape,
    )
    assert shapes_after == shapes  # nothing grew


def test_the_eager_caches_stop_growing(model, signals):
    stepper = DuplexStepper(model, rows=2)
    call(stepper, signals)
    assert {layer.keys.shape[-2] for layer in stepper.cache.layers} == {WINDOW - 1}


@pytest.mark.parametrize("logged", [WINDOW + 1, 3 * WINDOW + 2, 4 * WINDOW])
@pytest.mark.parametrize("step", [DuplexStepper, FastDuplexStepper])
def test_a_resume_after_the_wrap_continues_the_call_token_for_token(
    model, signals, eager, logged, step
):
    """Stream 0 rebuilt from all its ``logged`` frames into a batch busy
    with another stream continues the uninterrupted call exactly."""
    uninterrupted = eager[0]
    history = [(signals[0][i], uninterrupted[i].tokens) for i in range(logged)]
    stepper = step(model, rows=2)
    other = stepper.join()
    for index in range(2):
        stepper.tick({other: signals[1][index]})
    row = stepper.resume(history)
    continued = []
    for index in range(logged, TICKS):
        inputs = {other: signals[1][index - logged + 2], row: signals[0][index]}
        continued.append(stepper.tick(inputs)[row])
    assert_same(continued, uninterrupted[logged:])


def test_the_rebuild_prefills_a_window_a_forward_and_equals_the_replay(
    model, signals, eager, monkeypatch
):
    """Past the window the rebuild runs no tick (``tick`` would raise), and
    its caches equal those a tick-by-tick forced replay leaves."""
    logged = 3 * WINDOW + 1
    history = [(signals[0][i], eager[0][i].tokens) for i in range(logged)]
    replay = DuplexStepper(model, rows=1)
    row = replay.join()
    for samples, tokens in history:
        replay.tick({row: samples}, forced={row: tokens})

    def no_tick(*args, **kwargs):
        raise AssertionError("the rebuild ticked")

    monkeypatch.setattr(DuplexStepper, "tick", no_tick)
    rebuilt = DuplexStepper.rebuild(model, history)
    for mine, theirs in zip(rebuilt.cache.layers, replay.cache.layers, strict=True):
        np.testing.assert_allclose(mine.keys.numpy(), theirs.keys.numpy(), rtol=0, atol=1e-9)
        np.testing.assert_allclose(mine.values.numpy(), theirs.values.numpy(), rtol=0, atol=1e-9)
    assert rebuilt.timeline.length == replay.timeline.length == logged
    assert rebuilt.step == replay.step


def test_a_primed_call_resumed_past_the_window_continues_token_for_token(model, signals):
    codes = prompt_codes(model, pad_text=3)
    voice = encode_frames(model, np.random.default_rng(4).standard_normal(5000) * 0.2)
    prefix = prime_frames(codes, [5, 6, 7], voice)
    eager = DuplexStepper(model, rows=1)
    row = eager.join(prefix)
    expected = [eager.tick({row: signals[0][i]})[row] for i in range(TICKS)]
    logged = 3 * WINDOW
    assert len(prefix) + logged > 2 * WINDOW
    history = [(signals[0][i], expected[i].tokens) for i in range(logged)]
    fast = FastDuplexStepper(model, rows=2)
    other = fast.join()
    fast.tick({other: signals[1][0]})
    row = fast.resume(history, prefix)
    continued = []
    for index in range(logged, TICKS):
        continued.append(
            fast.tick({other: signals[1][1 + index - logged], row: signals[0][index]})[row]
        )
    assert_same(continued, expected[logged:])
