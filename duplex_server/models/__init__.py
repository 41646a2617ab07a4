"""Model adapters ("duplex plugins"): capabilities, and how a session's
records become engine requests and engine output becomes response chunks."""

from duplex_server.models.registry import MODEL_CHOICES, MODEL_NAMES, build_model, close_model

__all__ = ["MODEL_CHOICES", "MODEL_NAMES", "build_model", "close_model"]
