"""``--model moshi:PATH``: a Moshi-architecture checkpoint (Moshi, PersonaPlex
in Hugging Face format) served natively full duplex on the streaming port.

``build_moshi`` checks the directory at once (a path that is not a Moshi
checkpoint fails start-up) and starts the frame-synchronous engine, which
imports torch and transformers and loads the weights on its own thread.
"""

from duplex_server.models.moshi.model import MoshiModel, build_moshi

__all__ = ["MoshiModel", "build_moshi"]
