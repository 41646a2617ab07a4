"""How fast an LLM answer came: time to first token, time per output token
and the gaps between streamed pieces, measured where the responder receives
them (so engine queueing and the hop to the event loop count), reported as
the response's stage times (journaled with its output, so a replay reports
the same figures) and observed into the Prometheus histograms."""

from __future__ import annotations

import time

from duplex_server import metrics


class TokenClock:
    def __init__(self) -> None:
        self._submitted = time.perf_counter()
        self._arrivals: list[float] = []

    def tick(self) -> float | None:
        """One streamed piece arrived; on the first, the time to it in ms."""
        now = time.perf_counter()
        first = not self._arrivals
        if not first:
            metrics.LLM_INTER_TOKEN.observe(now - self._arrivals[-1])
        self._arrivals.append(now)
        if first:
            metrics.LLM_TTFT.observe(now - self._submitted)
            return (now - self._submitted) * 1000
        return None

    def figures(self) -> dict[str, float]:
        """The answer's token figures once it ended (none before a first
        token): ``llm_tpot_ms`` the mean gap after the first token, and the
        gaps' median, 95th percentile and maximum."""
        arrivals = self._arrivals
        if arrivals:  # the whole answer, as the other stages report their calls
            metrics.observe_stage("llm", arrivals[-1] - self._submitted, 0.0)
        figures = {"llm_output_pieces": float(len(arrivals))}
        if len(arrivals) < 2:
            return figures
        gaps = sorted((b - a) * 1000 for a, b in zip(arrivals, arrivals[1:], strict=False))
        tpot_ms = (arrivals[-1] - arrivals[0]) * 1000 / (len(arrivals) - 1)
        metrics.LLM_TPOT.observe(tpot_ms / 1000)
        figures.update(
            llm_tpot_ms=tpot_ms,
            llm_itl_p50_ms=_quantile(gaps, 0.5),
            llm_itl_p95_ms=_quantile(gaps, 0.95),
            llm_itl_max_ms=gaps[-1],
        )
        return figures


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
