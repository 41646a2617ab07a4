"""``DuplexClient``: a typed asyncio client for duplex-server sessions.

Depends on the standard library, ``websockets``, ``msgspec`` and ``protocol``;
never on the server.
"""

from clients.duplex import presets
from clients.duplex.audio import AudioFormat
from clients.duplex.client import DuplexClient, ReconnectPolicy, ResponseHandle, SessionConfig
from clients.duplex.collector import EventCollector
from clients.duplex.demux import ConnectionResumed, Demux
from clients.duplex.errors import (
    DuplexClientError,
    DuplexConnectionError,
    DuplexProtocolError,
    DuplexSessionClosedError,
)
from clients.duplex.trace import DuplexTrace
from clients.duplex.transport import Connect, Transport
from clients.duplex.wav import audio_data_url, read_pcm16_wav, write_pcm16_wav

__all__ = [
    "AudioFormat",
    "Connect",
    "ConnectionResumed",
    "Demux",
    "DuplexClient",
    "DuplexClientError",
    "DuplexConnectionError",
    "DuplexProtocolError",
    "DuplexSessionClosedError",
    "DuplexTrace",
    "EventCollector",
    "ReconnectPolicy",
    "ResponseHandle",
    "SessionConfig",
    "Transport",
    "audio_data_url",
    "presets",
    "read_pcm16_wav",
    "write_pcm16_wav",
]
