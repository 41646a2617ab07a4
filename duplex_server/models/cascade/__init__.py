"""The ``cascade`` model, the embedded default: Silero VAD -> Whisper tiny.en
on CTranslate2 (PocketSphinx, in a worker process, where Whisper is not
installed) -> responder -> eSpeak NG, every stage an engine worker of its
own, every model loaded once per process and shared by all sessions."""

from duplex_server.models.cascade.model import CascadeModel, build_cascade

__all__ = ["CascadeModel", "build_cascade"]
