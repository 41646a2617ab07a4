"""The engine core: cross-session scheduling of model work.

Backends (echo loopback today; vLLM, transformers, diffusers later) are
imported only by the adapters that use them, so the server starts without
heavy libraries.
"""

from duplex_server.engine.core import EngineBackend, EngineCore, EngineRequest, Priority

__all__ = ["EngineBackend", "EngineCore", "EngineRequest", "Priority"]
