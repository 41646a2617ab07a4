"""The fast batched step (``--moshi-step fast``) against the eager one on a
tiny random Moshi whose temporal window is 6 frames, so the ring buffer
wraps: the same greedy tokens and voice frame by frame, with rows joining
late and a freed row reused; a row rebuilt from its log continues the
uninterrupted run, with or without a persona and voice prompt primed
first; an emptied batch restarts in its own buffers."""

from __future__ import annotations

import numpy as np
import pytest

from duplex_bench.tiny_moshi import FRAME_SAMPLES, noise_frames, tiny_moshi, windowed
from duplex_server.engine.duplex.fast_step import FastDuplexStepper, make_stepper
from duplex_server.engine.duplex.prime import prime_frames
from duplex_server.engine.duplex.prompt_codec import encode_frames, prompt_codes
from duplex_server.engine.duplex.stepper import DuplexStepper

WINDOW = 6
TICKS = 14


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return windowed(tiny_moshi(tmp_path_factory.mktemp("moshi")), WINDOW)


@pytest.fixture(scope="module")
def signals():
    return noise_frames(5, streams=3, ticks=TICKS)


def churn(stepper, signals):
    """Two rows from the start, a third joins at tick 3, the second leaves at
    tick 8 and its row is reused by a fresh stream: each stream's frames."""
    streams: dict[str, list] = {"a": [], "b": [], "late": [], "reused": []}
    rows = {"a": stepper.join(), "b": stepper.join()}
    for tick in range(TICKS):
        if tick == 3:
            rows["late"] = stepper.join()
        if tick == 8:
            stepper.leave(rows.pop("b"))
            rows["reused"] = stepper.join()
        index = {"a": tick, "b": tick, "late": tick - 3, "reused": tick - 8}
        source = {"a": 0, "b": 1, "late": 2, "reused": 1}
        out = stepper.tick({row: signals[source[name]][index[name]] for name, row in rows.items()})
        for name, row in rows.items():
            streams[name].append(out[row])
    return streams


@pytest.fixture(scope="module")
def eager(model, signals):
    return churn(DuplexStepper(model, rows=3), signals)


def assert_same(got, expected):
    assert [f.step for f in got] == [f.step for f in expected]
    assert [f.tokens for f in got] == [f.tokens for f in expected]
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_allclose(mine.samples, theirs.samples, rtol=0, atol=1e-9)


def test_fast_step_equals_the_eager_step_across_the_ring_wrap(model, signals, eager):
    fast = churn(FastDuplexStepper(model, rows=3), signals)
    assert len(eager["a"]) == TICKS > WINDOW
    for name in eager:
        assert_same(fast[name], eager[name])


def test_a_row_rebuilt_from_its_log_continues_the_uninterrupted_run(model, signals, eager):
    """Resume on the fast step: a batch already serving another stream for
    a number of ticks that puts its ring at another slot rebuilds stream
    'a' from its logged frames (past the window) and continues it exactly."""
    logged, other_ticks = 9, 4
    uninterrupted = eager["a"]
    stepper = FastDuplexStepper(model, rows=2)
    other = stepper.join()
    for index in range(other_ticks):
        stepper.tick({other: signals[2][index]})
    history = [(signals[0][i], uninterrupted[i].tokens) for i in range(logged)]
    row = stepper.resume(history)
    continued = []
    for index in range(logged, TICKS):
        inputs = {other: signals[2][other_ticks + index - logged], row: signals[0][index]}
        continued.append(stepper.tick(inputs)[row])
    assert_same(continued, uninterrupted[logged:])


def test_a_primed_row_and_its_resume_equal_the_eager_step(model, signals):
    """A row joined with a persona and voice prompt (primed by the eager
    rebuild in a batch of its own, then copied into the ring) speaks as the
    eager step's primed row does, beside a busy row; and resumed from its
    log with the same prefix it continues that run."""
    codes = prompt_codes(model, pad_text=3)
    voice = encode_frames(model, np.random.default_rng(3).standard_normal(5000) * 0.2)
    prefix = prime_frames(codes, [5, 6, 7], voice)
    eager = DuplexStepper(model, rows=1)
    row = eager.join(prefix)
    expected = [eager.tick({row: signals[0][i]})[row] for i in range(TICKS)]
    fast = FastDuplexStepper(model, rows=2)
    other = fast.join()
    for index in range(3):
        fast.tick({other: signals[1][index]})
    primed = fast.join(prefix)
    got = [fast.tick({other: signals[1][3 + i], primed: signals[0][i]})[primed] for i in range(8)]
    assert_same(got, expected[:8])
    logged = 5
    history = [(signals[0][i], expected[i].tokens) for i in range(logged)]
    restarted = FastDuplexStepper(model, rows=1)
    row = restarted.resume(history, prefix)
    continued = [restarted.tick({row: signals[0][i]})[row] for i in range(logged, TICKS)]
    assert_same(continued, expected[logged:])


def test_an_emptied_batch_restarts_in_its_own_buffers(model, signals, eager):
    stepper = FastDuplexStepper(model, rows=1)
    keys = stepper.keys.data_ptr()
    row = stepper.join()
    for index in range(3):
        stepper.tick({row: signals[1][index]})
    stepper.leave(row)
    row = stepper.join()
    assert stepper.timeline.length == 0 and stepper.keys.data_ptr() == keys
    assert_same([stepper.tick({row: signals[0][i]})[row] for i in range(4)], eager["a"][:4])


def test_the_step_is_chosen_by_name(model):
    assert isinstance(make_stepper(model, 1, "fast"), FastDuplexStepper)
    assert type(make_stepper(model, 1, "eager")) is DuplexStepper
    with pytest.raises(ValueError, match="'eager' or 'fast'"):
        make_stepper(model, 1, "compiled")


def test_a_checkpoint_without_a_window_is_refused_at_load_not_at_a_tick(tmp_path):
    """The ring needs the model's sliding window (transformers' config insists
    on an int; 0 is none): the service says so in its load error (``/ready``
    stays 503), and a stream's frame gets that reason."""
    import json

    from duplex_server.engine.duplex.checkpoint import check_moshi_checkpoint
    from duplex_server.engine.duplex.service import DuplexService, StreamClosed

    directory = tiny_moshi(tmp_path / "moshi")
    config = json.loads((directory / "config.json").read_text())
    config["sliding_window"] = 0
    (directory / "config.json").write_text(json.dumps(config))
    service = DuplexService(
        check_moshi_checkpoint(str(directory)), device="cpu", dtype="float32", rows=1, step="fast"
    )
    try:
        assert not service.wait_loaded(timeout=600)
        assert "sliding_window" in (service.load_error or "")
        stream = service.open_stream()
        with pytest.raises(StreamClosed, match="sliding_window"):
            service.submit(stream, np.zeros(FRAME_SAMPLES, dtype=np.float32), lambda _: None)
    finally:
        service.close()
