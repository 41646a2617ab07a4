"""The frame-synchronous engine for native full-duplex speech models
(Moshi / PersonaPlex architecture): every live row advances one 80 ms frame
per tick, all rows in one batched step.

Nothing here knows about sessions or the wire: a row is a slot in the batch,
a frame is 1920 input samples in and a frame of tokens and samples out. The
torch modules (``timeline``, ``mimi_stream``, ``stepper``) are imported only
by the model that serves such a checkpoint.
"""

from duplex_server.engine.duplex.tokens import FrameTokens, PrimeFrame

__all__ = ["FrameTokens", "PrimeFrame"]
