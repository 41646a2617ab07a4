"""Cutting a session's input into a streaming model's units.

Pure: audio in (already at the model's rate), whole units out, and silence
units on request. The runtime decides when a pause has lasted a unit (it has
the clock); the framer only keeps the unit boundaries, so a pause that
starts mid-unit completes that unit with silence rather than shifting every
later unit.
"""

from __future__ import annotations

from duplex_server.sessions.core.model_port import InputUnit


class UnitFramer:
    def __init__(self, sample_rate_hz: int, unit_ms: int) -> None:
        self.sample_rate_hz = sample_rate_hz
        self.unit_bytes = sample_rate_hz * unit_ms // 1000 * 2
        self.next_index = 0
        self._pending = bytearray()

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    def push(self, pcm16: bytes) -> list[InputUnit]:
        """The whole units ``pcm16`` completes; the rest waits for more."""
        self._pending += pcm16
        units = []
        while len(self._pending) >= self.unit_bytes:
            units.append(self._unit(bytes(self._pending[: self.unit_bytes]), silence=False))
            del self._pending[: self.unit_bytes]
        return units

    def silence(self) -> InputUnit:
        """One unit of the pause: what is pending, completed with zeros."""
        pcm = bytes(self._pending) + bytes(self.unit_bytes - len(self._pending))
        heard_some = bool(self._pending)
        self._pending.clear()
        return self._unit(pcm, silence=not heard_some)

    def _unit(self, pcm: bytes, silence: bool) -> InputUnit:
        unit = InputUnit(
            index=self.next_index, pcm=pcm, sample_rate_hz=self.sample_rate_hz, silence=silence
        )
        self.next_index += 1
        return unit
