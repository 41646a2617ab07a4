"""Codecs and resampling against known signals."""

from __future__ import annotations

import numpy as np
import pytest

from duplex_server.audio import (
    AudioDecodeError,
    decode_to_pcm16,
    encode_from_pcm16,
    pcm16_duration_ms,
    resample_pcm16,
)
from duplex_server.audio.g711 import ALAW_TO_PCM16, ULAW_TO_PCM16, alaw_encode, ulaw_encode
from protocol.audio_formats import AudioFormat
from tests.wsclient import tone_pcm16


def peak_hz(pcm: bytes, rate: int) -> float:
    samples = np.frombuffer(pcm, "<i2").astype(float)
    return float(np.argmax(np.abs(np.fft.rfft(samples))) * rate / len(samples))


@pytest.mark.parametrize(
    ("src", "dst"), [(24000, 8000), (8000, 24000), (16000, 48000), (48000, 16000), (44100, 24000)]
)
def test_resampling_keeps_frequency_and_duration(src, dst):
    pcm = tone_pcm16(1000, rate=src, freq=700)
    out = resample_pcm16(pcm, src, dst)
    assert len(out) // 2 == dst
    assert peak_hz(out, dst) == pytest.approx(700, abs=2)


def test_downsampling_filters_aliases():
    # 10 kHz cannot exist at 8 kHz: it must be attenuated, not folded to 2 kHz.
    pcm = tone_pcm16(1000, rate=24000, freq=10_000, amp=16000)
    out = np.frombuffer(resample_pcm16(pcm, 24000, 8000), "<i2").astype(float)
    assert np.sqrt(np.mean(out**2)) < 0.1 * 16000 / np.sqrt(2)


def test_g711_tables_match_reference_points():
    assert ULAW_TO_PCM16[0xFF] == 0 and ULAW_TO_PCM16[0x7F] == 0
    assert ULAW_TO_PCM16[0x00] == -32124 and ULAW_TO_PCM16[0x80] == 32124
    assert ALAW_TO_PCM16[0xD5] == 8 and ALAW_TO_PCM16[0x55] == -8
    assert ALAW_TO_PCM16[0xAA] == 32256 and ALAW_TO_PCM16[0x2A] == -32256


@pytest.mark.parametrize(
    ("encode", "table"), [(ulaw_encode, ULAW_TO_PCM16), (alaw_encode, ALAW_TO_PCM16)]
)
def test_g711_round_trip_is_close(encode, table):
    samples = np.arange(-32768, 32768, 7, dtype=np.int32).astype(np.int16)
    decoded = table[encode(samples)].astype(float)
    error = np.abs(decoded - samples.astype(float))
    # Companding error grows with amplitude: within ~1/16 of the magnitude (+ step near 0).
    assert np.all(error <= np.abs(samples.astype(float)) / 16 + 16)
    # Every code decodes and re-encodes to itself.
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(table[encode(table[codes])], table[codes])


def test_float_input_is_clipped_and_checked():
    f32 = np.array([0.5, -2.0, 2.0], dtype="<f4").tobytes()
    pcm = np.frombuffer(decode_to_pcm16(f32, AudioFormat("pcm_f32le", 24000)), "<i2")
    assert list(pcm) == [16383, -32767, 32767]
    with pytest.raises(AudioDecodeError, match="NaN"):
        decode_to_pcm16(np.array([np.nan], dtype="<f4").tobytes(), AudioFormat("pcm_f32le", 24000))
    with pytest.raises(AudioDecodeError, match="even"):
        decode_to_pcm16(b"\x00", AudioFormat("pcm16", 24000))


def test_encode_to_each_output_format():
    pcm = tone_pcm16(100)
    assert len(encode_from_pcm16(pcm, 24000, AudioFormat("g711_ulaw", 8000))) == 800
    assert len(encode_from_pcm16(pcm, 24000, AudioFormat("pcm_f32le", 24000))) == 9600
    assert encode_from_pcm16(pcm, 24000, AudioFormat("pcm16", 24000)) == pcm


def test_duration_and_slice():
    pcm = tone_pcm16(200, rate=16000)
    assert pcm16_duration_ms(len(pcm), 16000) == 200.0


def test_opus_round_trip_keeps_the_tone():
    from duplex_server.audio.opus import RATE_HZ, OpusDecoder, OpusStream, split_packets

    stream = OpusStream()
    tone = tone_pcm16(1000, rate=RATE_HZ, freq=440)
    framed = stream.encode(tone[: len(tone) // 2]) + stream.encode(tone[len(tone) // 2 :])
    packets = split_packets(framed)
    assert len(packets) >= 48  # 20 ms packets (the encoder holds back its lookahead)
    decoder = OpusDecoder()
    pcm = b"".join(decoder.decode(packet) for packet in packets)
    assert peak_hz(pcm, RATE_HZ) == pytest.approx(440, abs=3)
    level = np.sqrt(np.mean(np.frombuffer(pcm, "<i2").astype(float) ** 2))
    assert level > 0.5 * 8000 / np.sqrt(2)  # not silence: the tone's energy is there


@pytest.mark.parametrize("packet", [b"\xff\xfe garbage", b""])
def test_undecodable_opus_is_an_audio_error(packet):
    with pytest.raises(AudioDecodeError, match="Opus"):
        decode_to_pcm16(packet, AudioFormat("opus", 48000))
