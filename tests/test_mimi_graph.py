"""Mimi at static shapes (``mimi_graph``: the codec path the fast step
captures as CUDA graphs) equals the eager streamers (``mimi_stream``) frame
by frame on the tiny model: rows that start late, a stream crossing the
codec transformer's window several times, a row adopted mid-stream from an
eager streamer (a resume), and the fast step with it against the fast step
with the eager codec. On a CUDA device the same comparison runs through the
captured graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duplex_bench.tiny_moshi import (
    AUDIO_VOCAB,
    FRAME_SAMPLES,
    MIMI_SLIDING_WINDOW,
    NUM_CODEBOOKS,
    float64_moshi,
    frame,
    noise_frames,
    tiny_moshi,
    windowed,
)
from duplex_server.engine.duplex.fast_step import FastDuplexStepper
from duplex_server.engine.duplex.mimi_graph import GraphMimiDecoder, GraphMimiEncoder
from duplex_server.engine.duplex.mimi_stream import MimiStreamDecoder, MimiStreamEncoder

FRAMES = 20  # 40 codec-transformer steps; the late row 30: five times its window
LATE = 5


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return tiny_moshi(tmp_path_factory.mktemp("moshi-graph"))


@pytest.fixture(scope="module")
def mimi(directory):
    return float64_moshi(directory).audio_encoder


@pytest.fixture(scope="module")
def speech():
    generator = torch.Generator().manual_seed(11)
    return torch.randn(2, FRAMES * FRAME_SAMPLES, generator=generator, dtype=torch.float64) * 0.3


@pytest.fixture(scope="module")
def codes():
    generator = torch.Generator().manual_seed(12)
    return torch.randint(0, AUDIO_VOCAB, (2, NUM_CODEBOOKS, FRAMES), generator=generator)


def stream_both(mimi, speech, codes, encoders, decoders):
    """Both codecs over the same two rows, row 1 restarting at ``LATE``:
    every tick's codes and samples from each."""
    out: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in encoders]
    for tick in range(FRAMES):
        if tick == LATE:
            for codec in (*encoders, *decoders):
                codec.reset(1)
        own = max(tick - LATE, 0)
        samples = torch.stack([frame(speech[0], tick), frame(speech[1], own)])
        frame_codes = torch.stack([codes[0, :, tick], codes[1, :, own]])
        for index, (encoder, decoder) in enumerate(zip(encoders, decoders, strict=True)):
            out[index].append((encoder.encode(samples), decoder.decode(frame_codes)))
    return out


def assert_same_stream(got, expected, atol):
    for (codes, samples), (their_codes, their_samples) in zip(got, expected, strict=True):
        assert torch.equal(codes.cpu(), their_codes.cpu())
        torch.testing.assert_close(samples.cpu(), their_samples.cpu(), rtol=0, atol=atol)


def test_the_streams_cross_the_codec_window():
    assert 2 * (FRAMES - LATE) > 4 * MIMI_SLIDING_WINDOW


@torch.no_grad()
def test_static_codec_equals_the_eager_streamers_frame_by_frame(mimi, speech, codes):
    eager, static = stream_both(
        mimi,
        speech,
        codes,
        [MimiStreamEncoder(mimi, 2, NUM_CODEBOOKS), GraphMimiEncoder(mimi, 2, NUM_CODEBOOKS)],
        [MimiStreamDecoder(mimi, 2), GraphMimiDecoder(mimi, 2)],
    )
    assert len({int(c) for c, _ in eager for c in c.flatten()}) > NUM_CODEBOOKS  # varied codes
    assert_same_stream(static, eager, atol=1e-9)


@torch.no_grad()
def test_a_row_adopted_mid_stream_continues_as_the_eager_stream(mimi, speech, codes):
    """A resume: a stream run alone by the eager streamers for a while (past
    the window), adopted into row 1 of a static codec whose row 0 is busy,
    continues exactly as the eager stream alone does."""
    head = 9
    alone_encoder = MimiStreamEncoder(mimi, 1, NUM_CODEBOOKS)
    alone_decoder = MimiStreamDecoder(mimi, 1)
    expected = []
    for tick in range(FRAMES):
        expected.append(
            (
                alone_encoder.encode(frame(speech[1:], tick))[0],
                alone_decoder.decode(codes[1:, :, tick])[0],
            )
        )
        if tick == head - 1:  # a rebuilt stream: its state after `head` frames
            rebuilt_encoder = MimiStreamEncoder(mimi, 1, NUM_CODEBOOKS)
            rebuilt_decoder = MimiStreamDecoder(mimi, 1)
            rebuilt_encoder.encode_frames(speech[1:, : head * FRAME_SAMPLES])
            rebuilt_decoder.decode_frames(codes[1:, :, :head])
    encoder, decoder = GraphMimiEncoder(mimi, 2, NUM_CODEBOOKS), GraphMimiDecoder(mimi, 2)
    for tick in range(3):  # the batch is at another ring slot than the stream
        encoder.encode(torch.stack([frame(speech[0], tick)] * 2))
        decoder.decode(torch.stack([codes[0, :, tick]] * 2))
    encoder.adopt(1, rebuilt_encoder)
    decoder.adopt(1, rebuilt_decoder)
    got = []
    for tick in range(head, FRAMES):
        samples = torch.stack([frame(speech[0], tick), frame(speech[1], tick)])
        frame_codes = torch.stack([codes[0, :, tick], codes[1, :, tick]])
        got.append((encoder.encode(samples)[1], decoder.decode(frame_codes)[1]))
    assert_same_stream(got, expected[head:], atol=1e-9)


@torch.no_grad()
def test_the_fast_step_speaks_alike_with_either_codec(directory):
    """Tokens and voice of the fast step with the static codec equal the
    fast step with transformers' streaming codec, rows joining late."""
    model = windowed(directory, 6)
    signals = noise_frames(21, streams=2, ticks=FRAMES)

    def run(graphed_codec: bool) -> list:
        stepper = FastDuplexStepper(model, rows=2, graphed_codec=graphed_codec)
        first = stepper.join()
        frames = []
        for tick in range(FRAMES):
            if tick == LATE:
                second = stepper.join()
            inputs = {first: signals[0][tick]}
            if tick >= LATE:
                inputs[second] = signals[1][tick - LATE]
            frames.append(stepper.tick(inputs))
        return frames

    static, eager = run(True), run(False)
    assert isinstance(FastDuplexStepper(model, 1).encoder, GraphMimiEncoder)
    for mine, theirs in zip(static, eager, strict=True):
        assert mine.keys() == theirs.keys()
        for row in mine:
            assert mine[row].tokens == theirs[row].tokens
            np.testing.assert_allclose(mine[row].samples, theirs[row].samples, rtol=0, atol=1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@torch.no_grad()
def test_on_cuda_the_captured_graphs_equal_the_eager_streamers(directory):
    from transformers import MoshiForConditionalGeneration

    model = MoshiForConditionalGeneration.from_pretrained(directory, dtype=torch.float32)
    mimi = torch.nn.Module.to(model, "cuda").eval().audio_encoder
    generator = torch.Generator().manual_seed(11)
    speech = (torch.randn(2, FRAMES * FRAME_SAMPLES, generator=generator) * 0.3).cuda()
    codes = torch.randint(0, AUDIO_VOCAB, (2, NUM_CODEBOOKS, FRAMES), generator=generator).cuda()
    graphed = [GraphMimiEncoder(mimi, 2, NUM_CODEBOOKS), GraphMimiDecoder(mimi, 2)]
    assert graphed[0].use_graph and graphed[1].use_graph
    eager, replayed = stream_both(
        mimi,
        speech,
        codes,
        [MimiStreamEncoder(mimi, 2, NUM_CODEBOOKS), graphed[0]],
        [MimiStreamDecoder(mimi, 2), graphed[1]],
    )
    assert graphed[0]._replay.graph is not None and graphed[1]._replay.graph is not None
    assert_same_stream(replayed, eager, atol=1e-4)


def test_without_graphs_capture_leaves_the_batch_untouched(directory):
    stepper = FastDuplexStepper(windowed(directory, 6), rows=2)
    stepper.capture()
    assert not any(stepper.live) and stepper.timeline.length == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@torch.no_grad()
def test_on_cuda_a_batch_captured_at_load_speaks_as_the_eager_step(directory):
    """``capture`` (what the service runs at load) leaves all four graphs
    captured and an empty batch; the streams then joined speak as the
    eager step's do."""
    from transformers import MoshiForConditionalGeneration

    from duplex_server.engine.duplex.stepper import DuplexStepper

    model = MoshiForConditionalGeneration.from_pretrained(
        directory, dtype=torch.float32, sliding_window=6
    )
    model = torch.nn.Module.to(model, "cuda").eval()
    signals = noise_frames(22, streams=2, ticks=FRAMES)
    fast = FastDuplexStepper(model, rows=2)
    fast.capture()
    replays = [fast._temporal_replay, fast._depth_replay]
    replays += [fast.encoder._replay, fast.decoder._replay]
    assert all(replay.graph is not None for replay in replays) and not any(fast.live)
    eager = DuplexStepper(model, rows=2)
    rows = [(fast.join(), eager.join()) for _ in range(2)]
    for tick in range(FRAMES):
        got = fast.tick({mine: signals[i][tick] for i, (mine, _) in enumerate(rows)})
        expected = eager.tick({theirs: signals[i][tick] for i, (_, theirs) in enumerate(rows)})
        for mine, theirs in rows:
            assert got[mine].tokens == expected[theirs].tokens
            np.testing.assert_allclose(got[mine].samples, expected[theirs].samples, atol=1e-3)
