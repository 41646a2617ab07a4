"""The cascade's end-of-turn model for ``semantic_vad``: Smart Turn v3.2
(``engine/audio/smart_turn.py``) behind the session core's ``TurnEnding`` port."""

from __future__ import annotations

from duplex_server.engine.audio.smart_turn import SmartTurn, TurnModelBusy, TurnModelFailed
from duplex_server.sessions.core.model_port import TurnModelUnavailable


class SmartTurnEnding:
    """The process's one Smart Turn, its failures as the port names them."""

    def __init__(self, model: SmartTurn) -> None:
        self.model = model

    async def probability(self, pcm16: bytes, sample_rate_hz: int) -> float:
        try:
            return await self.model.probability(pcm16, sample_rate_hz)
        except (TurnModelBusy, TurnModelFailed) as exc:  # this pause goes unjudged
            raise TurnModelUnavailable(str(exc) or type(exc).__name__) from exc


def smart_turn_ending() -> SmartTurnEnding | None:
    """None where the pipecat-ai wheel that ships the model is not installed."""
    model = SmartTurn.shared()
    return None if model is None else SmartTurnEnding(model)
