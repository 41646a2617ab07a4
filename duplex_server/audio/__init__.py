"""PCM conversion between wire formats and the server's canonical pcm16.

A leaf package (numpy, libsoxr, PyAV) shared by the session core, which
decodes client input, the runtime, which keeps a session's streams (one
resampler and encoder per response, one resampler into a streaming model),
and the model adapters, which resample whole utterances for their engines.
"""

from duplex_server.audio.convert import (
    AudioDecodeError,
    StreamEncoder,
    decode_to_pcm16,
    encode_from_pcm16,
    pcm16_duration_ms,
    pcm16_rms,
)
from duplex_server.audio.resample import StreamResampler, resample_pcm16

__all__ = [
    "AudioDecodeError",
    "StreamEncoder",
    "StreamResampler",
    "decode_to_pcm16",
    "encode_from_pcm16",
    "pcm16_duration_ms",
    "pcm16_rms",
    "resample_pcm16",
]
