"""Sampling in the batched Moshi step: the Gumbel-max draw is the softmax at
the temperature, within the top k; a greedy row is the argmax; a sampling
row's tokens depend on its seed and its frames only (alone or in a busy
batch, eager or fast step, and resumed from its log), so a crash does not
change what the session says."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duplex_bench.tiny_moshi import noise_frames, tiny_moshi, windowed
from duplex_server.engine.duplex.fast_step import FastDuplexStepper
from duplex_server.engine.duplex.sampling import GREEDY, Sampling, choose, draw, gumbel
from duplex_server.engine.duplex.stepper import DuplexStepper
from duplex_server.models.moshi.model import session_seed

TICKS = 12
WINDOW = 6
HOT = Sampling(temperature=1.2, seed=77)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return windowed(tiny_moshi(tmp_path_factory.mktemp("moshi")), WINDOW)


@pytest.fixture(scope="module")
def signals():
    return noise_frames(9, streams=2, ticks=TICKS)


def run(stepper, row, frames):
    return [stepper.tick({row: samples})[row] for samples in frames]


def tokens(frames):
    return [f.tokens for f in frames]


def alone(model, signals, sampling, stepper_type=DuplexStepper):
    stepper = stepper_type(model, rows=1)
    row = stepper.join()
    stepper.sample(row, sampling)
    return run(stepper, row, signals[0])


def test_a_greedy_row_chooses_the_argmax():
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(1))
    chosen = choose(logits, torch.ones(5), torch.zeros(5, 300), top_k=25)
    assert torch.equal(chosen, logits.argmax(dim=-1))


def test_the_draw_is_the_softmax_at_the_temperature_within_the_top_k():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    temperature, top_k, draws = 0.7, 3, 4000
    counts = np.zeros(5)
    for index in range(draws):
        noise = gumbel(torch.rand(1, 5, generator=torch.Generator().manual_seed(index)))
        counts[int(choose(logits, torch.tensor([1 / temperature]), noise, top_k))] += 1
    kept = torch.softmax(logits[0, :top_k] / temperature, dim=-1).numpy()
    assert counts[top_k:].sum() == 0
    np.testing.assert_allclose(counts[:top_k] / draws, kept, atol=0.03)


def test_every_greedy_batch_draws_nothing():
    assert draw([GREEDY, GREEDY], [3, 4], 10, 2, 8, torch.device("cpu")) is None
    noise = draw([GREEDY, HOT], [3, 4], 10, 2, 8, torch.device("cpu"))
    assert noise is not None
    assert noise.inverse_temperature.tolist() == pytest.approx([1.0, 1 / 1.2])
    assert not noise.text[0].any() and noise.text[1].any() and noise.audio[1].any()


def test_a_sampling_row_depends_on_its_seed_not_on_its_batch(model, signals):
    greedy = alone(model, signals, GREEDY)
    sampled = alone(model, signals, HOT)
    assert tokens(sampled) != tokens(greedy)
    assert tokens(alone(model, signals, Sampling(1.2, seed=78))) != tokens(sampled)
    assert tokens(alone(model, signals, Sampling(0.0, seed=78))) == tokens(greedy)
    # beside a busy row that samples with another seed, joined later
    stepper = DuplexStepper(model, rows=2)
    other = stepper.join()
    stepper.sample(other, Sampling(0.9, seed=5))
    for samples in signals[1][:3]:
        stepper.tick({other: samples})
    row = stepper.join()
    stepper.sample(row, HOT)
    got = []
    for index, samples in enumerate(signals[0][: TICKS - 3]):
        got.append(stepper.tick({other: signals[1][3 + index], row: samples})[row])
    assert tokens(got) == tokens(sampled[: TICKS - 3])


def test_a_sampling_row_resumed_from_its_log_draws_what_it_would_have(model, signals):
    sampled = alone(model, signals, HOT)
    logged = 7  # past the window: rebuilt tick by tick
    history = [(signals[0][i], sampled[i].tokens) for i in range(logged)]
    for stepper_type in (DuplexStepper, FastDuplexStepper):
        restarted = stepper_type(model, rows=1)
        row = restarted.resume(history)
        restarted.sample(row, HOT)
        continued = run(restarted, row, signals[0][logged:])
        assert tokens(continued) == tokens(sampled[logged:]), stepper_type.__name__


def test_the_fast_step_samples_as_the_eager_step(model, signals):
    eager = alone(model, signals, HOT)
    fast = alone(model, signals, HOT, FastDuplexStepper)
    assert tokens(fast) == tokens(eager)
    for mine, theirs in zip(fast, eager, strict=True):
        np.testing.assert_allclose(mine.samples, theirs.samples, rtol=0, atol=1e-9)


def test_a_session_seed_is_its_ids_alone():
    assert session_seed("sess_a") == session_seed("sess_a") != session_seed("sess_b")
    assert 0 <= session_seed("sess_a") < 2**63
