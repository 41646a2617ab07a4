"""PCM conversion between wire formats and the server's canonical pcm16.

A leaf package (numpy only) shared by the session core, which decodes
client input, and the model adapters, which resample for their engines.
"""

from duplex_server.audio.convert import (
    AudioDecodeError,
    decode_to_pcm16,
    encode_from_pcm16,
    pcm16_duration_ms,
    pcm16_rms,
    resample_pcm16,
)

__all__ = [
    "AudioDecodeError",
    "decode_to_pcm16",
    "encode_from_pcm16",
    "pcm16_duration_ms",
    "pcm16_rms",
    "resample_pcm16",
]
