"""The load generator's own CPU, so a bench can show it measured the server.

Every bench client runs in this process on one event loop: once that loop
is busy most of the time, latencies are the generator's, not the server's,
and the run says so (``generator_saturated``) instead of reporting them as
the server's numbers.
"""

from __future__ import annotations

import psutil

# Of one core: the generator's event loop is a single thread.
SATURATED_PERCENT = 90.0


class GeneratorCpu:
    def __init__(self) -> None:
        self._process = psutil.Process()

    def start(self) -> None:
        """Begin the measured window."""
        self._process.cpu_percent(None)

    def report(self) -> dict:
        """The generator's CPU over the window, and whether it saturated."""
        percent = round(self._process.cpu_percent(None), 1)
        return {
            "generator_cpu_percent": percent,
            "generator_saturated": percent >= SATURATED_PERCENT,
        }


def validity(*phases: dict) -> dict:
    """A run is valid when no phase's generator saturated."""
    saturated = [index for index, phase in enumerate(phases) if phase.get("generator_saturated")]
    return {
        "valid": not saturated,
        "invalid_reason": (
            f"the load generator saturated its core (phase {saturated[0]})" if saturated else None
        ),
    }
