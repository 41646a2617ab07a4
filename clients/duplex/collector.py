"""``EventCollector``: timestamps what a session did, for latency summaries."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from protocol import server_events as se


@dataclass
class _Mark:
    at: float
    event: Any


@dataclass
class EventCollector:
    """Feed it every event (``collector.add(event)``); ask for ``timing_summary()``.

    ``mark_sent(kind)`` notes when the client did something worth timing
    from: ``"commit"`` (to first text/audio) or ``"barge_in"`` (to the
    interruption taking effect).
    """

    events: list[_Mark] = field(default_factory=list)
    sent: dict[str, list[float]] = field(default_factory=dict)
    clock: Any = time.monotonic

    def add(self, event: Any) -> None:
        self.events.append(_Mark(self.clock(), event))

    def mark_sent(self, kind: str) -> None:
        self.sent.setdefault(kind, []).append(self.clock())

    def _first_after(self, start: float, kinds: tuple[type, ...]) -> float | None:
        for mark in self.events:
            if mark.at >= start and isinstance(mark.event, kinds):
                return (mark.at - start) * 1000
        return None

    def timing_summary(self) -> dict[str, Any]:
        commit = next(iter(self.sent.get("commit", [])), None)
        audio = [m.at for m in self.events if isinstance(m.event, se.OutputAudioDelta)]
        gaps = sorted((b - a) * 1000 for a, b in zip(audio, audio[1:], strict=False))
        barge = next(iter(self.sent.get("barge_in", [])), None)
        responses = {}
        for mark in self.events:
            if isinstance(mark.event, se.ResponseDone) and mark.event.response is not None:
                response = mark.event.response
                duplex = response.duplex
                playback = msgspec.to_builtins(duplex.playback) if duplex is not None else {}
                responses[response.id] = {"status": response.status, **playback}
        return {
            "first_text_ms": None
            if commit is None
            else self._first_after(commit, (se.OutputAudioTranscriptDelta, se.OutputTextDelta)),
            "first_audio_ms": None
            if commit is None
            else self._first_after(commit, (se.OutputAudioDelta,)),
            "audio_deltas": len(audio),
            "audio_cadence_ms": {
                "mean": sum(gaps) / len(gaps) if gaps else None,
                "p95": gaps[int(0.95 * (len(gaps) - 1))] if gaps else None,
            },
            "barge_in_ms": None
            if barge is None
            else self._first_after(barge, (se.OutputAudioCleared,)),
            "responses": responses,
        }
