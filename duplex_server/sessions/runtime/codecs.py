"""A session's stateful codecs: Opus in, and each response's audio out.

Opus packets depend on the ones before, so a session keeps one decoder for
its input (made on first use). A response's chunks go out through one
:class:`~duplex_server.audio.StreamEncoder` (its resampler, and for Opus its
encoder, run across the chunks: no seams between them); a new response, and
so every epoch fence, starts a fresh one."""

from __future__ import annotations

from collections.abc import Callable

from duplex_server.audio import StreamEncoder
from duplex_server.audio.opus import OpusDecoder
from duplex_server.sessions.core.model_output import output_format
from duplex_server.sessions.core.state import SessionState
from protocol.audio_formats import AudioFormat


class SessionCodecs:
    def __init__(self) -> None:
        self._decoder: OpusDecoder | None = None
        # (response id, its output format, its encoder)
        self._encoder: tuple[str, AudioFormat, StreamEncoder] | None = None

    def decode_opus(self, packet: bytes) -> bytes:
        """pcm16 of one input packet, through the session's one decoder."""
        if self._decoder is None:
            self._decoder = OpusDecoder()
        return self._decoder.decode(packet)

    def stream_encoder(self, response_id: str, fmt: AudioFormat) -> Callable[[bytes, int], bytes]:
        """``encode(pcm16, rate)`` for the response's next chunk, through the
        response's one encoder (made on its first chunk, and anew if the
        session's output format changes under it)."""
        if self._encoder is None or self._encoder[:2] != (response_id, fmt):
            self._encoder = (response_id, fmt, StreamEncoder(fmt))
        return self._encoder[2].encode

    def response_encoder(
        self, state: SessionState, response_id: str
    ) -> Callable[[bytes, int], bytes] | None:
        """:meth:`stream_encoder` in the format ``response_id`` speaks in."""
        return self.stream_encoder(response_id, output_format(state, response_id))
