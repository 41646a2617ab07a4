"""Mimi streamed frame by frame equals Mimi run over the whole signal: the
encoder through transformers' own streaming mode, the decoder through ours
(transformers' frame-by-frame decode is not exact, and a test says so), for
one row and for rows that start at different ticks in one batch."""

from __future__ import annotations

import pytest
import torch

from duplex_bench.tiny_moshi import (
    AUDIO_VOCAB,
    FRAME_SAMPLES,
    MIMI_SLIDING_WINDOW,
    NUM_CODEBOOKS,
    float64_moshi,
    frame,
    tiny_moshi,
)
from duplex_server.engine.duplex.mimi_stream import MimiStreamDecoder, MimiStreamEncoder

FRAMES = 12  # 24 decoder-transformer steps: four times its sliding window


@pytest.fixture(scope="module")
def mimi(tmp_path_factory):
    directory = tiny_moshi(tmp_path_factory.mktemp("moshi"))
    return float64_moshi(directory).audio_encoder


@pytest.fixture(scope="module")
def speech():
    generator = torch.Generator().manual_seed(7)
    return torch.randn(2, FRAMES * FRAME_SAMPLES, generator=generator, dtype=torch.float64) * 0.3


@pytest.fixture(scope="module")
def codes():
    generator = torch.Generator().manual_seed(8)
    return torch.randint(0, AUDIO_VOCAB, (2, NUM_CODEBOOKS, FRAMES), generator=generator)


def test_the_tiny_codec_has_real_frames(mimi):
    assert mimi.config.frame_size == FRAME_SAMPLES
    assert mimi.config.frame_rate == 12.5
    assert 2 * FRAMES > 2 * MIMI_SLIDING_WINDOW  # the streams below cross the window


@torch.no_grad()
def test_transformers_streaming_encode_equals_full_encode(mimi, speech):
    full = mimi.encode(speech[:1, None], num_quantizers=NUM_CODEBOOKS).audio_codes
    padding_cache = encoder_cache = None
    streamed = []
    for index in range(FRAMES):
        out = mimi.encode(
            frame(speech[:1, None], index),
            num_quantizers=NUM_CODEBOOKS,
            use_streaming=True,
            padding_cache=padding_cache,
            encoder_cache=encoder_cache,
        )
        padding_cache, encoder_cache = out.padding_cache, out.encoder_cache
        streamed.append(out.audio_codes)
    assert len(set(full.flatten().tolist())) > NUM_CODEBOOKS  # real, varied codes
    assert torch.equal(torch.cat(streamed, dim=-1), full)


@torch.no_grad()
def test_stream_encoder_equals_full_encode(mimi, speech):
    encoder = MimiStreamEncoder(mimi, rows=1, num_codebooks=NUM_CODEBOOKS)
    streamed = torch.stack([encoder.encode(frame(speech[:1], i)) for i in range(FRAMES)], -1)
    full = mimi.encode(speech[:1, None], num_quantizers=NUM_CODEBOOKS).audio_codes
    assert torch.equal(streamed, full)


@torch.no_grad()
def test_frame_by_frame_transformers_decode_is_not_a_full_decode(mimi, codes):
    """Why the server decodes with its own streamer: no overlap, no padding cache."""
    full = mimi.decode(codes[:1]).audio_values[0, 0]
    pieces = [mimi.decode(codes[:1, :, i : i + 1]).audio_values[0, 0] for i in range(FRAMES)]
    assert (torch.cat(pieces) - full).abs().max() > 0.1 * full.abs().max()


@torch.no_grad()
def test_stream_decoder_equals_full_decode(mimi, codes):
    decoder = MimiStreamDecoder(mimi, rows=1)
    streamed = torch.cat([decoder.decode(codes[:1, :, i]) for i in range(FRAMES)], dim=-1)
    full = mimi.decode(codes[:1]).audio_values[:, 0]
    assert streamed.shape == full.shape == (1, FRAMES * FRAME_SAMPLES)
    assert full.abs().max() > 1.0
    torch.testing.assert_close(streamed, full, rtol=0, atol=1e-9)


@torch.no_grad()
def test_a_row_that_starts_late_streams_as_if_alone(mimi, speech, codes):
    late = 5
    encoder = MimiStreamEncoder(mimi, rows=2, num_codebooks=NUM_CODEBOOKS)
    decoder = MimiStreamDecoder(mimi, rows=2)
    late_codes, late_samples = [], []
    for tick in range(FRAMES + late):
        if tick == late:
            encoder.reset(1)
            decoder.reset(1)
        own = tick - late
        samples = torch.stack([frame(speech[0], tick % FRAMES), frame(speech[1], max(own, 0))])
        frame_codes = torch.stack([codes[0, :, tick % FRAMES], codes[1, :, max(own, 0)]])
        encoded = encoder.encode(samples)
        decoded = decoder.decode(frame_codes)
        if own >= 0:
            late_codes.append(encoded[1])
            late_samples.append(decoded[1])
    alone = mimi.encode(speech[1:2, None], num_quantizers=NUM_CODEBOOKS).audio_codes[0]
    assert torch.equal(torch.stack(late_codes, dim=-1), alone)
    alone_samples = mimi.decode(codes[1:2]).audio_values[0, 0]
    torch.testing.assert_close(torch.cat(late_samples), alone_samples, rtol=0, atol=1e-9)


@torch.no_grad()
def test_a_stream_continued_many_frames_at_once_equals_frame_by_frame(mimi, speech, codes):
    """A rebuild's prefill: after some frames one by one, the rest in one
    call each way, and the state after it streams on alike."""
    encoder = MimiStreamEncoder(mimi, rows=1, num_codebooks=NUM_CODEBOOKS)
    decoder = MimiStreamDecoder(mimi, rows=1)
    head, tail = 3, FRAMES - 4
    encoded = [encoder.encode(frame(speech[:1], i)) for i in range(head)]
    decoded = [decoder.decode(codes[:1, :, i]) for i in range(head)]
    encoded.append(encoder.encode_frames(speech[:1, head * FRAME_SAMPLES : tail * FRAME_SAMPLES]))
    decoded.append(decoder.decode_frames(codes[:1, :, head:tail]))
    for i in range(tail, FRAMES):  # and on, frame by frame
        encoded.append(encoder.encode(frame(speech[:1], i))[..., None])
        decoded.append(decoder.decode(codes[:1, :, i]))
    encoded[:head] = [codes_[..., None] for codes_ in encoded[:head]]
    full_codes = mimi.encode(speech[:1, None], num_quantizers=NUM_CODEBOOKS).audio_codes
    assert torch.equal(torch.cat(encoded, dim=-1), full_codes)
    full = mimi.decode(codes[:1]).audio_values[:, 0]
    torch.testing.assert_close(torch.cat(decoded, dim=-1), full, rtol=0, atol=1e-9)
