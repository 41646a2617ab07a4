"""A session's stateful codecs: Opus in and Opus out.

Opus packets depend on the ones before, so a session keeps one decoder for
its input (made on first use) and one encoder per response for its output
(no seams between a response's chunks). Stateless formats need neither."""

from __future__ import annotations

from collections.abc import Callable

from duplex_server.audio import resample_pcm16
from duplex_server.audio.opus import RATE_HZ as OPUS_RATE_HZ
from duplex_server.audio.opus import OpusDecoder, OpusStream
from protocol.audio_formats import OPUS, AudioFormat


class SessionCodecs:
    def __init__(self) -> None:
        self._decoder: OpusDecoder | None = None
        self._encoder: tuple[str, OpusStream] | None = None  # (response id, its encoder)

    def decode_opus(self, packet: bytes) -> bytes:
        """pcm16 of one input packet, through the session's one decoder."""
        if self._decoder is None:
            self._decoder = OpusDecoder()
        return self._decoder.decode(packet)

    def stream_encoder(
        self, response_id: str, fmt: AudioFormat
    ) -> Callable[[bytes, int], bytes] | None:
        """``encode(pcm16, rate)`` for a response whose output format keeps
        state across chunks (Opus); None for the stateless ones."""
        if fmt.name != OPUS:
            return None
        if self._encoder is None or self._encoder[0] != response_id:
            self._encoder = (response_id, OpusStream())
        stream = self._encoder[1]
        return lambda pcm, rate: stream.encode(resample_pcm16(pcm, rate, OPUS_RATE_HZ))
