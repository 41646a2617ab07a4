"""Streaming resampling: a tone cut into chunks comes out clean at every
pair of rates (no clicks at the seams), each chunk as long as its duration,
and a stream starts afresh where a session's audio does."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from duplex_server.audio import StreamEncoder, StreamResampler, resample_pcm16
from duplex_server.sessions.core.model_port import InputUnit, UnitOutput
from duplex_server.sessions.runtime.codecs import SessionCodecs
from duplex_server.sessions.runtime.unit_feed import UnitFeed
from protocol.audio_formats import MAX_RATE_HZ, MIN_RATE_HZ, AudioFormat

# The rates clients and models use, from the lowest served to the highest.
RATES = (MIN_RATE_HZ, 11_025, 16_000, 22_050, 24_000, 32_000, 44_100, MAX_RATE_HZ)
PAIRS = [pair for pair in itertools.product(RATES, RATES) if pair[0] != pair[1]]
TONE_HZ = 440.0
AMPLITUDE = 0.9 * 32767  # -0.9 dBFS: pcm16's own rounding leaves ~94 dB at best
SKIP_S = 0.05  # the tone's own onset and end ring; the seams are in between


def tone(rate: int, seconds: float = 1.0) -> np.ndarray:
    return AMPLITUDE * np.sin(2 * np.pi * TONE_HZ * np.arange(int(rate * seconds)) / rate)


def pcm(samples: np.ndarray) -> bytes:
    return np.round(samples).astype("<i2").tobytes()


def samples(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float64)


def chunked(data: bytes, rate: int, chunk_ms: int) -> list[bytes]:
    step = rate * chunk_ms // 1000 * 2
    return [data[at : at + step] for at in range(0, len(data), step)]


def streamed(src: int, dst: int, chunk_ms: int) -> tuple[np.ndarray, list[int], int]:
    """The tone through one stream: its output (lead-in dropped), where each
    push's output ended (in that output), and the lead-in."""
    stream = StreamResampler(src, dst)
    pieces = [stream.push(chunk) for chunk in chunked(pcm(tone(src)), src, chunk_ms)]
    ends = list(itertools.accumulate(len(piece) // 2 for piece in pieces))
    out = samples(b"".join(pieces) + stream.flush())
    return out[stream.delay :], [end - stream.delay for end in ends], stream.delay


def error(out: np.ndarray, rate: int) -> tuple[np.ndarray, slice]:
    """Sample errors against the ideal tone, and the span clear of its edges."""
    ideal = tone(rate)[: len(out)]
    skip = int(rate * SKIP_S)
    return out[: len(ideal)] - ideal, slice(skip, len(ideal) - skip)


def snr_db(out: np.ndarray, rate: int) -> float:
    err, span = error(out, rate)
    ideal = tone(rate)[span]
    return float(10 * np.log10(np.sum(ideal**2) / np.sum(err[span] ** 2)))


@pytest.mark.parametrize("chunk_ms", [20, 100])
@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_a_chunked_tone_comes_out_clean(src, dst, chunk_ms):
    out, _, _ = streamed(src, dst, chunk_ms)
    assert len(out) == len(tone(dst))
    assert snr_db(out, dst) >= 90.0


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_no_click_at_the_seams(src, dst):
    """The largest error within a few samples of a seam between two chunks'
    output is no larger than anywhere else (per chunk resampling made them
    up to 17 % of full scale)."""
    out, ends, _ = streamed(src, dst, 20)
    err, span = error(out, dst)
    near = np.zeros(len(err), dtype=bool)
    for end in ends:
        near[max(0, end - 3) : end + 3] = True
    clear = np.zeros(len(err), dtype=bool)
    clear[span] = True
    assert np.abs(err[near & clear]).max() <= np.abs(err[~near & clear]).max()


@pytest.mark.parametrize(("src", "dst"), [(24_000, 8_000), (8_000, 48_000), (44_100, 16_000)])
def test_each_chunk_is_as_long_as_its_duration(src, dst):
    stream = StreamResampler(src, dst)
    sent = pushed = 0
    for size in [1, 7, 480, 0, 333, 2400, 19]:
        pushed += size
        sent += len(stream.push(bytes(2 * size))) // 2
        assert sent == pushed * dst // src
    assert len(stream.flush()) // 2 == stream.delay


@pytest.mark.parametrize(("src", "dst"), [(24_000, 8_000), (16_000, 24_000), (44_100, 48_000)])
def test_a_stream_is_the_whole_signal_resampled(src, dst):
    """Pushed in chunks and flushed, a stream gives what one call on the
    whole signal gives (to a rounding step), the lead-in aside."""
    signal = pcm(tone(src, 0.3))
    stream = StreamResampler(src, dst)
    out = b"".join(stream.push(chunk) for chunk in chunked(signal, src, 20)) + stream.flush()
    whole = samples(resample_pcm16(signal, src, dst))
    assert not samples(out)[: stream.delay].any()
    assert np.abs(samples(out)[stream.delay :] - whole).max() <= 1


def test_reset_and_flush_start_a_fresh_signal():
    first, second = pcm(tone(24_000, 0.1)), pcm(-tone(24_000, 0.1))
    fresh = StreamResampler(24_000, 8_000).push(second)
    stream = StreamResampler(24_000, 8_000)
    stream.push(first)
    stream.reset()
    assert stream.push(second) == fresh
    stream = StreamResampler(24_000, 8_000)
    stream.push(first)
    assert len(stream.flush()) // 2 == stream.delay
    assert stream.flush() == b""  # nothing heard since: nothing held back
    assert stream.push(second) == fresh


def test_equal_rates_pass_through():
    stream = StreamResampler(24_000, 24_000)
    assert stream.delay == 0
    assert stream.push(b"\x01\x02\x03\x04") == b"\x01\x02\x03\x04"
    assert stream.flush() == b""


def test_a_response_keeps_one_encoder_and_a_new_one_starts_fresh():
    """Output: one stream per response (each fence opens a new response)."""
    g711 = AudioFormat("g711_ulaw", 8_000)
    chunks = chunked(pcm(tone(24_000, 0.2)), 24_000, 100)
    codecs = SessionCodecs()
    first = [codecs.stream_encoder("resp_1", g711)(chunk, 24_000) for chunk in chunks]
    again = codecs.stream_encoder("resp_2", g711)(chunks[0], 24_000)
    assert again == first[0]  # a new response: a fresh stream
    lone = StreamEncoder(g711).encode(chunks[1], 24_000)
    assert first[1] != lone  # the second chunk continued the first
    assert [len(piece) for piece in first] == [800, 800]


def test_the_encoder_follows_a_change_of_the_models_rate():
    encoder = StreamEncoder(AudioFormat("pcm16", 8_000))
    out = encoder.encode(pcm(tone(24_000, 0.1)), 24_000)
    out += encoder.encode(pcm(tone(16_000, 0.1)), 16_000)
    # The first stream's tail comes before the second stream's lead-in.
    assert len(out) // 2 == 2 * 800 + StreamResampler(16_000, 8_000).delay


class Listener:
    """A streaming model at 16 kHz that keeps every unit it hears."""

    sample_rate_hz = 16_000
    unit_ms = 20

    primes_at_input = False

    def __init__(self) -> None:
        self.units: list[InputUnit] = []

    resume_units = 0

    def open(self, session_id: str, setup: object, history=()) -> Listener:
        return self

    async def step(self, unit: InputUnit) -> list[UnitOutput]:
        self.units.append(unit)
        return []

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


async def test_a_streaming_model_hears_the_input_without_seams():
    """Input: one stream per session into the model's rate; the pause after
    speech brings its held-back tail ahead of the silence units."""
    model = Listener()
    feed = UnitFeed(model, "sess_resample", lambda message: None, lambda: 0)
    feed.start()
    try:
        for chunk in chunked(pcm(tone(24_000, 0.5)), 24_000, 20):
            feed.feed(chunk, 24_000)
        for _ in range(50):
            await asyncio.sleep(0.02)
            if any(unit.silence for unit in model.units):
                break
    finally:
        await feed.close()
    heard = samples(b"".join(unit.pcm for unit in model.units))
    delay = StreamResampler(24_000, 16_000).delay
    assert not heard[:delay].any()
    assert snr_db(heard[delay : delay + 8_000], 16_000) >= 90.0
