"""Prometheus text exposition for the few numbers operators and benches read.

Hand-rolled on purpose: a histogram and a counter are a few lines, and the
server keeps no dependency for them.
"""

from __future__ import annotations

import bisect

LATENCY_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class Histogram:
    def __init__(
        self, name: str, help_text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    ) -> None:
        self.name = name
        self.help = help_text
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last slot: +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            cumulative += count
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum {self.total}")
        lines.append(f"{self.name}_count {self.count}")
        return lines


class Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name = name
        self.help = help_text
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount

    def render(self) -> list[str]:
        return [
            f"# HELP {self.name} {self.help}",
            f"# TYPE {self.name} counter",
            f"{self.name} {self.value}",
        ]


class Metrics:
    def __init__(self) -> None:
        self.append_latency = Histogram(
            "duplex_append_latency_seconds",
            "client frame received -> its records appended to the session log",
        )
        self.client_events = Counter("duplex_client_events_total", "client events applied")
        self.sessions_opened = Counter("duplex_sessions_opened_total", "sessions opened")

    def observe_append(self, seconds: float) -> None:
        self.append_latency.observe(seconds)
        self.client_events.inc()

    def render(self, live_sessions: int) -> str:
        lines = [
            *self.append_latency.render(),
            *self.client_events.render(),
            *self.sessions_opened.render(),
            "# HELP duplex_sessions_live sessions with a live actor",
            "# TYPE duplex_sessions_live gauge",
            f"duplex_sessions_live {live_sessions}",
        ]
        return "\n".join(lines) + "\n"


def parse_histogram(text: str, name: str) -> list[tuple[float, int]]:
    """``[(upper_bound, cumulative_count)]`` of one histogram in exposition text."""
    prefix = f'{name}_bucket{{le="'
    out = []
    for line in text.splitlines():
        if line.startswith(prefix):
            bound, _, count = line[len(prefix) :].partition('"} ')
            out.append((float("inf") if bound == "+Inf" else float(bound), int(count)))
    return out


def histogram_quantile(buckets: list[tuple[float, int]], q: float) -> float | None:
    """Prometheus-style quantile with linear interpolation inside the bucket."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            span = count - lower_count
            fraction = (rank - lower_count) / span if span else 0.0
            return lower_bound + (bound - lower_bound) * fraction
        lower_bound, lower_count = bound, count
    return lower_bound
