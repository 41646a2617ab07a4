"""What the log writer's tracing hook costs per append, off and on.

Run: ``.venv/bin/python -m tests.tracing_cost`` (not a test: it prints
figures, docs/operations/tracing.md quotes them). Off, the hook is the
writer's ``if self.tracer is not None``; on, it is the OTel session tracer
reading the batch (the SDK's batch processor queues the spans; its export
thread is given an exporter that drops them, so the figure is the hot path's
own, not the collector's).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from duplex_server.sessions.core.records import (
    AudioBody,
    CommitBody,
    DecisionBody,
    OutBody,
    Record,
)
from duplex_server.sessions.core.state import initial_state
from duplex_server.tracing import SessionTracer
from duplex_server.tracing_otel import OtlpTracing

ROUNDS = 200_000


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _hook(tracer: SessionTracer | None, state, records: list[Record], rounds: int) -> float:
    """ns per call of the writer's hook, as log_writer.commit spells it."""
    started = time.perf_counter_ns()
    for _ in range(rounds):
        if tracer is not None:
            tracer.landed(state, records, 0.0001)
    return (time.perf_counter_ns() - started) / rounds


def main() -> None:
    state = initial_state("sess_bench", "cascade")
    audio = [Record(0, 0, "client", AudioBody(b"\0" * 4800, 24_000, "pcm16", 100.0))]
    out = [
        Record(
            0,
            0,
            "engine",
            OutBody(1, "response.output_audio.delta", b"{}", response_id="r", audio_ms=100.0),
        )
    ]
    tracing = OtlpTracing(None, {}, 0.005, exporter=_Drop())
    tracer = tracing.session("sess_bench", "cascade")
    turn = [
        Record(0, 0, "server", CommitBody("item", True, stage_ms={"asr_final_ms": 30.0})),
        Record(0, 0, "server", DecisionBody("speak", response_id="r")),
    ]
    tracer.landed(state, turn, 0.0001)  # an answer open, as while one is spoken
    print(f"{'batch':<26}{'off ns':>10}{'on ns':>10}")
    for name, records in (("input audio append", audio), ("answer audio delta", out)):
        _hook(None, state, records, 10_000)  # warm
        _hook(tracer, state, records, 10_000)
        off = _hook(None, state, records, ROUNDS)
        on = _hook(tracer, state, records, ROUNDS)
        print(f"{name:<26}{off:>10.1f}{on:>10.1f}")
    # A turn's batches make spans: commit + asr + turn.commit + response.
    rounds = 20_000
    started = time.perf_counter_ns()
    done = [Record(0, 0, "server", DecisionBody("response_done", "r", status="completed"))]
    for _ in range(rounds):
        tracer.landed(state, turn, 0.0001)
        tracer.landed(state, done, 0.0001)
    per_turn = (time.perf_counter_ns() - started) / rounds
    print(f"{'turn (commit+answer end)':<26}{0.0:>10.1f}{per_turn:>10.1f}")
    tracer.closed("shutdown")
    tracing.shutdown()


if __name__ == "__main__":
    main()
