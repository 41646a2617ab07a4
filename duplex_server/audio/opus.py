"""Opus through PyAV (which bundles libopus): raw packets, 48 kHz mono.

Input: each ``input_audio_buffer.append`` carries one raw packet. Output: an
audio delta carries the chunk as consecutive 20 ms packets, each preceded by
its length as a 2-byte big-endian integer (a delta holds several packets,
and raw Opus packets do not delimit themselves); :func:`split_packets`
undoes it. A response keeps one encoder across its chunks (:class:`OpusStream`),
so the stream has no seams.
"""

from __future__ import annotations

import fractions
import struct

import numpy as np

RATE_HZ = 48_000
FRAME = 960  # samples per 20 ms packet
BIT_RATE = 32_000


class OpusError(ValueError):
    pass


class OpusDecoder:
    """One input stream's decoder: Opus frames overlap, so a stream's packets
    go through one decoder in order (a fresh decoder per packet loses most of
    each packet's energy at its start)."""

    def __init__(self) -> None:
        import av

        self._av = av
        self._decoder = av.CodecContext.create("opus", "r")
        self._decoder.sample_rate = RATE_HZ
        self._decoder.layout = "mono"

    def decode(self, packet: bytes) -> bytes:
        """pcm16 of one raw Opus packet."""
        if not packet:
            raise OpusError("empty Opus packet")
        try:
            frames = self._decoder.decode(self._av.Packet(packet))
        except self._av.error.FFmpegError as exc:
            raise OpusError(f"not a decodable Opus packet ({exc.strerror})") from None
        pcm = [_to_pcm16(frame.to_ndarray()) for frame in frames]
        if not pcm:
            raise OpusError("the Opus packet decoded to no audio")
        return b"".join(pcm)


def decode_packet(packet: bytes) -> bytes:
    """A packet on its own (no stream at hand): quality suffers at its start."""
    return OpusDecoder().decode(packet)


def _to_pcm16(samples: np.ndarray) -> bytes:
    mono = samples.mean(axis=0) if samples.ndim == 2 else samples
    if mono.dtype.kind == "f":
        mono = np.clip(mono, -1.0, 1.0) * 32767.0
    return mono.astype("<i2").tobytes()


class OpusStream:
    """One response's encoder: pcm16 at 48 kHz in, framed packets out."""

    def __init__(self) -> None:
        import av

        self._av = av
        self._encoder = av.CodecContext.create("libopus", "w")
        self._encoder.sample_rate = RATE_HZ
        self._encoder.layout = "mono"
        self._encoder.format = "s16"
        self._encoder.bit_rate = BIT_RATE
        self._encoder.open()
        self._pending = np.zeros(0, dtype="<i2")
        self._pts = 0

    def encode(self, pcm16: bytes) -> bytes:
        """Framed packets for every complete 20 ms of audio so far (the rest waits)."""
        samples = np.concatenate([self._pending, np.frombuffer(pcm16, dtype="<i2")])
        whole = len(samples) // FRAME * FRAME
        self._pending = samples[whole:]
        packets: list[bytes] = []
        for at in range(0, whole, FRAME):
            frame = self._av.AudioFrame.from_ndarray(
                samples[at : at + FRAME].reshape(1, -1), format="s16", layout="mono"
            )
            frame.sample_rate = RATE_HZ
            frame.pts = self._pts
            frame.time_base = fractions.Fraction(1, RATE_HZ)
            self._pts += FRAME
            packets += [bytes(packet) for packet in self._encoder.encode(frame)]
        return join_packets(packets)


def join_packets(packets: list[bytes]) -> bytes:
    return b"".join(struct.pack(">H", len(p)) + p for p in packets)


def split_packets(data: bytes) -> list[bytes]:
    packets, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from(">H", data, at)
        packets.append(data[at + 2 : at + 2 + size])
        at += 2 + size
    return packets
