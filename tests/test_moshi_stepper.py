"""The frame-synchronous batched step of a tiny random Moshi: batched rows
equal each row alone, a late joiner and a reused row equal a fresh stream,
the per-frame tokens are what transformers' own teacher-forced forward
predicts, a row rebuilt from its logged frames continues exactly as
the uninterrupted run, and a row primed with a persona and a voice prompt
joins a busy batch as it would start alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duplex_bench.tiny_moshi import (
    AUDIO_VOCAB,
    FRAME_SAMPLES,
    NUM_CODEBOOKS,
    TEXT_VOCAB,
    float64_moshi,
    frame,
    noise_signals,
    tiny_moshi,
)
from duplex_server.engine.duplex import FrameTokens, PrimeFrame
from duplex_server.engine.duplex.prime import prime_frames
from duplex_server.engine.duplex.prompt_codec import encode_frames, prompt_codes
from duplex_server.engine.duplex.stepper import DuplexStepper, RowsFull

FRAMES = 14


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return float64_moshi(tiny_moshi(tmp_path_factory.mktemp("moshi")))


@pytest.fixture(scope="module")
def voices():
    """Three users' input signals (noise at speech-like level), long enough for any test."""
    return noise_signals(11, 3, 3 * FRAMES * FRAME_SAMPLES)


def alone(model, signal, frames=FRAMES):
    stepper = DuplexStepper(model, rows=1)
    row = stepper.join()
    return [stepper.tick({row: frame(signal, index)})[row] for index in range(frames)]


def assert_same_frames(got, expected):
    assert [f.step for f in got] == [f.step for f in expected]
    assert [f.tokens for f in got] == [f.tokens for f in expected]
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_allclose(mine.samples, theirs.samples, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def solo(model, voices):
    return [alone(model, signal) for signal in voices]


def test_each_tick_returns_the_frame_tokens_and_a_frame_of_voice(solo):
    frames = solo[0]
    assert [f.step for f in frames] == list(range(FRAMES))
    for f in frames:
        assert 0 <= f.tokens.text < TEXT_VOCAB
        assert len(f.tokens.audio) == NUM_CODEBOOKS
        assert all(0 <= code < AUDIO_VOCAB for code in f.tokens.audio)
        assert f.samples.shape == (FRAME_SAMPLES,) and f.samples.dtype == np.float32
    assert not frames[0].samples.any()  # frame 0's codebook 0 is the begin-of-stream token
    assert all(np.abs(f.samples).max() > 0.01 for f in frames[1:])
    assert len({f.tokens for f in frames}) > FRAMES // 2  # the model reacts: not a constant


def test_batched_rows_equal_each_row_alone(model, voices, solo):
    stepper = DuplexStepper(model, rows=3)
    rows = [stepper.join() for _ in voices]
    got: list[list] = [[] for _ in voices]
    for index in range(FRAMES):
        out = stepper.tick({row: frame(voices[i], index) for i, row in enumerate(rows)})
        for i, row in enumerate(rows):
            got[i].append(out[row])
    for mine, expected in zip(got, solo, strict=True):
        assert_same_frames(mine, expected)
    assert solo[0][3].tokens != solo[1][3].tokens  # rows are not copies of each other


def test_a_late_joiner_and_a_reused_row_equal_a_fresh_stream(model, voices, solo):
    stepper = DuplexStepper(model, rows=2)
    first, second = stepper.join(), stepper.join()
    with pytest.raises(RowsFull):
        stepper.join()
    late = 4
    joined: list = []
    for index in range(late + FRAMES):
        inputs = {first: frame(voices[0], index)}
        if index < late:
            inputs[second] = frame(voices[1], index)
        elif index == late:
            stepper.leave(second)
            assert stepper.join() == second  # the freed row is the one reused
        if index >= late:
            inputs[second] = frame(voices[2], index - late)
        out = stepper.tick(inputs)
        if index >= late:
            joined.append(out[second])
    assert_same_frames(joined, solo[2])


def test_tokens_are_what_transformers_teacher_forced_forward_predicts(model, voices, solo):
    """The stepper's columns (text, own codes, the user's codes with codebooks
    1.. a frame late) fed to ``MoshiForConditionalGeneration`` in one forward
    predict, greedily, the text tokens the stepper chose; its depth decoder
    fed the chosen codes predicts each next codebook."""
    frames = solo[0]
    text = torch.tensor([[TEXT_VOCAB] + [f.tokens.text for f in frames[:-1]]])
    own = torch.tensor([[AUDIO_VOCAB] * NUM_CODEBOOKS] + [list(f.tokens.audio) for f in frames])
    own = own[:-1].T[None]
    signal = torch.from_numpy(voices[0][: FRAMES * FRAME_SAMPLES]).double()[None, None]
    user = model.audio_encoder.encode(signal, num_quantizers=NUM_CODEBOOKS).audio_codes
    user, _ = model.build_delay_pattern_mask(
        user, bos_token_id=AUDIO_VOCAB, pad_token_id=AUDIO_VOCAB, max_length=FRAMES + 1
    )
    with torch.no_grad():
        out = model(input_ids=text, moshi_audio_codes=own, user_audio_codes=user, use_cache=False)
        assert out.logits[0].argmax(-1).tolist() == [f.tokens.text for f in frames]
        hidden = out.last_hidden_state[0, :, None, :]
        chosen = torch.tensor([[f.tokens.text, *f.tokens.audio] for f in frames])
        depth = model.depth_decoder(input_ids=chosen[:, :-1], last_hidden_state=hidden)
    assert torch.equal(depth.logits.argmax(-1), chosen[:, 1:])


@pytest.mark.parametrize(
    ("logged", "other_frames"),
    [(6, 2), (6, 10), (1, 0), (FRAMES - 1, 0)],
    ids=["into-a-younger-batch", "into-an-older-batch", "one-frame", "into-an-empty-batch"],
)
def test_a_row_rebuilt_from_its_log_continues_the_uninterrupted_run(
    model, voices, solo, logged, other_frames
):
    """Resume after a crash: a fresh stepper (a restarted replica), maybe
    serving another session already, rebuilds the row by a teacher-forced
    prefill over the logged frames (input samples + generated tokens); the
    frames that follow equal the uninterrupted run's."""
    uninterrupted = solo[0]
    stepper = DuplexStepper(model, rows=2)
    other = stepper.join()
    for index in range(other_frames):
        stepper.tick({other: frame(voices[1], index)})
    history = [(frame(voices[0], i), uninterrupted[i].tokens) for i in range(logged)]
    row = stepper.resume(history)
    continued = []
    for index in range(logged, FRAMES):
        inputs = {
            other: frame(voices[1], other_frames + index - logged),
            row: frame(voices[0], index),
        }
        continued.append(stepper.tick(inputs)[row])
    assert_same_frames(continued, uninterrupted[logged:])


def test_forced_tokens_are_taken_as_given(model, voices):
    stepper = DuplexStepper(model, rows=1)
    row = stepper.join()
    forced = FrameTokens(text=3, audio=(1, 2, 3, 4))
    out = stepper.tick({row: frame(voices[0], 0)}, forced={row: forced})
    assert out[row].tokens == forced


def test_bad_tick_inputs_are_refused(model, voices):
    stepper = DuplexStepper(model, rows=2)
    row = stepper.join()
    with pytest.raises(ValueError, match="exactly the live rows"):
        stepper.tick({})
    with pytest.raises(ValueError, match="1920 samples"):
        stepper.tick({row: voices[0][:100]})
    with pytest.raises(ValueError, match="not live"):
        stepper.tick({row: frame(voices[0], 0)}, forced={1: FrameTokens(0, (0, 0, 0, 0))})


def test_an_emptied_batch_starts_afresh(model, voices, solo):
    """Once every row has left, the next join drops the shared timeline: it
    does not grow while nobody is served, and the new stream is a fresh one."""
    stepper = DuplexStepper(model, rows=1)
    row = stepper.join()
    for index in range(3):
        stepper.tick({row: frame(voices[1], index)})
    assert stepper.timeline.length == 3
    stepper.leave(row)
    row = stepper.join()
    assert stepper.timeline.length == 0
    assert_same_frames(
        [stepper.tick({row: frame(voices[0], i)})[row] for i in range(4)], solo[0][:4]
    )


def prompt(model) -> list[PrimeFrame]:
    """A persona and a voice prompt as the service would prime them: the
    fixed frames' codes from the model's own Mimi, a voice prompt of noise."""
    codes = prompt_codes(model, pad_text=3)
    voice = encode_frames(model, (np.random.default_rng(3).standard_normal(5000) * 0.2))
    return prime_frames(codes, [5, 6, 7], voice)


def test_a_primed_row_joins_a_busy_batch_as_it_would_start_alone(model, voices, solo):
    """Priming runs the prompt's frames teacher-forced in a batch of its own
    and splices the row in: the live row does not move, and the primed row's
    frames equal those of the same prompt and input run alone."""
    prefix = prompt(model)
    alone = DuplexStepper(model, rows=1)
    row = alone.join(prefix)
    assert alone.step[row] == len(prefix)
    primed_alone = [alone.tick({row: frame(voices[0], i)})[row] for i in range(6)]
    # the persona changes what the model says
    assert [f.tokens for f in primed_alone] != [f.tokens for f in solo[0][:6]]
    stepper = DuplexStepper(model, rows=2)
    other = stepper.join()
    for index in range(3):
        stepper.tick({other: frame(voices[1], index)})
    primed = stepper.join(prefix)
    got, theirs = [], []
    for index in range(6):
        out = stepper.tick({other: frame(voices[1], 3 + index), primed: frame(voices[0], index)})
        got.append(out[primed])
        theirs.append(out[other])
    assert_same_frames(got, primed_alone)
    assert_same_frames(theirs, solo[1][3:9])


def test_a_primed_row_resumes_with_its_prefix_replayed(model, voices):
    prefix = prompt(model)
    stepper = DuplexStepper(model, rows=1)
    row = stepper.join(prefix)
    run = [stepper.tick({row: frame(voices[0], i)})[row] for i in range(8)]
    history = [(frame(voices[0], i), run[i].tokens) for i in range(5)]
    restarted = DuplexStepper(model, rows=1)
    row = restarted.resume(history, prefix)
    continued = [restarted.tick({row: frame(voices[0], i)})[row] for i in (5, 6, 7)]
    assert_same_frames(continued, run[5:])


def test_prime_ticks_take_exactly_the_given_tokens(model):
    stepper = DuplexStepper(model, rows=2)
    row = stepper.join()
    frame_ = PrimeFrame(user=(1, 2, 3, 4), tokens=FrameTokens(5, (6, 7, 8, 9)))
    assert stepper.prime_tick({row: frame_})[row].tokens == frame_.tokens
    with pytest.raises(ValueError, match="exactly the live rows"):
        stepper.prime_tick({1: frame_})
    with pytest.raises(ValueError, match="one a codebook"):
        stepper.prime_tick({row: PrimeFrame(user=(1,), tokens=frame_.tokens)})


def test_joining_with_a_prefix_equals_priming_tick_by_tick(model, voices):
    """``join(prefix)`` (a rebuild in a batch of its own, then adopted)
    leaves the row that ``prime_tick`` frame by frame leaves."""
    prefix = prompt(model)
    ticked = DuplexStepper(model, rows=1)
    row = ticked.join()
    for prime in prefix:
        ticked.prime_tick({row: prime})
    forward = DuplexStepper(model, rows=1)
    joined = forward.join(prefix)
    expected = [ticked.tick({row: frame(voices[0], i)})[row] for i in range(6)]
    got = [forward.tick({joined: frame(voices[0], i)})[joined] for i in range(6)]
    assert_same_frames(got, expected)
