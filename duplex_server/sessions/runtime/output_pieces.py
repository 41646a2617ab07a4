"""A model's output cut into pieces the actor encodes without holding the loop.

Its own module because both feeds (``turn_feed``, ``unit_feed``) use it and
``model_feed`` builds the feeds: kept there, it made an import circle.
"""

from __future__ import annotations

from duplex_server.sessions.core.model_port import UnitOutput

# A model's audio is encoded for the wire in pieces of at most this, so one
# huge chunk from a model never holds the event loop for long.
MAX_OUTPUT_PIECE_MS = 1000


def bounded(output: UnitOutput) -> list[UnitOutput]:
    """``output`` with its audio cut into pieces of at most
    ``MAX_OUTPUT_PIECE_MS``. Its text and stage times ride on the first piece; its floor
    decision on the first if it takes the floor (``speak``), else on the
    last, with any tool call."""
    step = output.sample_rate_hz * MAX_OUTPUT_PIECE_MS // 1000 * 2
    if len(output.audio) <= step:
        return [output]
    audio = [output.audio[at : at + step] for at in range(0, len(output.audio), step)]
    pieces = [UnitOutput(audio=piece, sample_rate_hz=output.sample_rate_hz) for piece in audio]
    pieces[0].text = output.text
    pieces[0].stage_ms = output.stage_ms
    if output.decision == "speak":
        pieces[0].decision = output.decision
    else:
        pieces[-1].decision = output.decision
    pieces[-1].function_call = output.function_call
    return pieces
