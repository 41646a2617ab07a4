"""The ``cascade`` model, the embedded default: Silero VAD -> PocketSphinx ->
responder -> eSpeak NG, every stage on a worker thread of its own, every
model loaded once per process and shared by all sessions."""

from duplex_server.models.cascade.model import CascadeModel, build_cascade

__all__ = ["CascadeModel", "build_cascade"]
