"""The OpenTelemetry side of session traces (imported only when tracing is on).

One trace per session: a ``session`` span, under it a ``turn`` span per
user turn (from VAD's speech start, or the commit when nothing heard one,
to the end of its answer) and under the turn what it took. Each span is
read off the records as they land (``SessionTracer.landed``), timed by when
they landed, or by the stage figures the model reported (``stage_ms``) for
what happened inside the model; docs/operations/tracing.md lists them. No
transcript, text or audio goes into a span: a trace carries timings, ids
and the session's own ``tracing`` labels, never what was said.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from duplex_server.sessions.core.records import (
    CloseBody,
    CommitBody,
    DecisionBody,
    FenceBody,
    ItemBody,
    OutBody,
    Record,
)
from duplex_server.sessions.core.state import SessionState
from protocol.session_config import TracingConfig

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "duplex-server"
_TOOL_DONE = "response.function_call_arguments.done"


class _CallNamed(msgspec.Struct):
    call_id: str = ""
    name: str = ""


_decode_call = msgspec.json.Decoder(_CallNamed).decode


class OtlpTracing:
    """A tracer provider of the server's own (the process's global one is
    left alone), exporting over OTLP/HTTP in batches from the SDK's thread.
    The SDK's ``OTEL_*`` variables (headers, timeout, batch schedule,
    resource attributes, ``OTEL_SERVICE_NAME``) apply as they do anywhere."""

    def __init__(
        self,
        endpoint: str | None,
        environ: Mapping[str, str],
        store_append_threshold_s: float,
        exporter: SpanExporter | None = None,
    ) -> None:
        named = {} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: DEFAULT_SERVICE_NAME}
        self.provider = TracerProvider(resource=Resource.create(named))
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=endpoint))
        )
        self._tracer = self.provider.get_tracer("duplex_server")
        self._threshold_s = store_append_threshold_s
        self._shut = False

    def session(self, session_id: str, model: str) -> OtlpSessionTracer:
        return OtlpSessionTracer(self._tracer, session_id, model, self._threshold_s)

    def shutdown(self) -> None:
        if not self._shut:  # the SDK warns on a second shutdown
            self._shut = True
            self.provider.shutdown()


class _Answer:
    """The response being traced: its span and what of it was seen so far."""

    def __init__(self, span: Span, response_id: str, started_ns: int, turn: Span | None) -> None:
        self.span = span
        self.turn = turn  # the turn it answers (None: no turn was open)
        self.context = trace.set_span_in_context(span)
        self.id = response_id
        self.started_ns = started_ns
        self.first_audio = False
        self.first_text = False
        self.stage_ms: dict[str, float] = {}


class OtlpSessionTracer:
    def __init__(
        self, tracer: trace.Tracer, session_id: str, model: str, threshold_s: float
    ) -> None:
        self._tracer = tracer
        self._threshold_s = threshold_s
        self._root = tracer.start_span(
            "session", attributes={"duplex.session.id": session_id, "duplex.model": model}
        )
        self._root_context = trace.set_span_in_context(self._root)
        self._tracing: str | TracingConfig | None = None
        self._labels: dict[str, AttributeValue] = {}
        self._turn: Span | None = None
        self._turn_context = self._root_context
        self._speech: Span | None = None
        self._stopped: Span | None = None  # speech that a batch's decision ended
        self._asr_started: int | None = None  # the batch's commit's recognition
        self._answer: _Answer | None = None
        self._tools: dict[str, Span] = {}  # call id -> the client's tool call

    # --- the hook --------------------------------------------------------------

    def landed(self, state: SessionState, records: list[Record], append_s: float) -> None:
        """A fault here is the trace's, never the session's: logged, and the
        append it followed stands."""
        try:
            self._landed(state, records, append_s)
        except Exception:
            log.exception("tracing: a batch's spans were not recorded")

    def _landed(self, state: SessionState, records: list[Record], append_s: float) -> None:
        now = time.time_ns()
        decided = now - int(append_s * 1e9)  # when the batch was built
        if state.config.tracing is not self._tracing:
            self._relabel(state.config.tracing)
        for record in records:
            # By type, one lookup: most batches (input audio) make no span.
            handler = _HANDLERS.get(type(record.body))
            if handler is not None:
                handler(self, record.body, now, decided)
        if self._stopped is not None:
            # The speech ended when VAD said so: before the recognition that
            # the commit in the same batch waited for.
            self._stopped.end(self._asr_started or decided)
            self._stopped = self._asr_started = None
        if append_s >= self._threshold_s:
            context = self._answer.context if self._answer is not None else self._turn_context
            span = self._start("store.append", now - int(append_s * 1e9), context)
            span.set_attribute("duplex.store.records", len(records))
            span.end(now)

    def closed(self, reason: str) -> None:
        try:
            self._closed(reason)
        except Exception:
            log.exception("tracing: the session's spans were not ended")

    def _closed(self, reason: str) -> None:
        now = time.time_ns()
        for span in self._tools.values():
            span.set_attribute("duplex.tool.answered", False)
            span.end(now)
        self._tools.clear()
        self._end_answer(now, "incomplete")
        self._end_turn(now)
        self._root.set_attribute("duplex.session.exit", reason)
        self._root.end(now)

    # --- records -----------------------------------------------------------------

    def _fence(self, body: FenceBody, now: int, decided: int) -> None:
        if self._answer is not None:
            self._answer.span.add_event("fence", {"duplex.fence.reason": body.reason}, now)

    def _close_record(self, body: CloseBody, now: int, decided: int) -> None:
        self._root.set_attribute("duplex.close.reason", body.reason)

    def _decision(self, body: DecisionBody, now: int, decided: int) -> None:
        match body.action:
            case "speech_started":
                self._end_turn(now)
                self._start_turn(now, body.item_id)
                self._speech = self._start("vad.speech", now, self._turn_context)
                self._speech.set_attribute("duplex.audio_start_ms", body.audio_ms)
            case "speech_stopped" if self._speech is not None:
                self._speech.set_attribute("duplex.audio_end_ms", body.audio_ms)
                self._stopped, self._speech = self._speech, None  # ended after the batch
            case "speak" if body.response_id is not None:
                self._end_answer(now, "incomplete")
                span = self._start("response", now, self._turn_context)
                span.set_attribute("duplex.response.id", body.response_id)
                span.set_attribute("duplex.modalities", list(body.modalities))
                self._answer = _Answer(span, body.response_id, now, self._turn)
            case "response_done" if self._answer is not None:
                answered = self._answer.turn
                self._end_answer(now, body.status or "completed", body.reason)
                if answered is not None and answered is self._turn:
                    self._end_turn(now)  # speech over the answer opened a turn of its own
            case "overlap.decision" if self._answer is not None and body.overlap is not None:
                attributes = {"duplex.overlap": body.overlap, "duplex.overlap.reason": body.reason}
                self._answer.span.add_event("overlap.decision", attributes, now)
            case _:
                pass

    def _commit(self, body: CommitBody, now: int, decided: int) -> None:
        """The turn's commit; the recognition it waited for ended as it was decided."""
        if self._turn is None:
            self._start_turn(decided, body.item_id)
        asr_ms = body.stage_ms.get("asr_final_ms")
        if asr_ms is not None:
            self._asr_started = decided - int(asr_ms * 1e6)
            asr = self._start("asr", self._asr_started, self._turn_context)
            asr.set_attribute("duplex.item.id", body.item_id)
            asr.end(decided)
        commit = self._start("turn.commit", decided, self._turn_context)
        commit.set_attribute("duplex.item.id", body.item_id)
        commit.set_attribute("duplex.is_speech", body.is_speech)
        commit.set_attribute("duplex.response_create", body.response_create)
        for name, ms in body.stage_ms.items():
            commit.set_attribute(f"duplex.stage.{name}", ms)
        commit.end(decided)

    def _out(self, body: OutBody, now: int, decided: int) -> None:
        answer = self._answer
        if answer is None or body.response_id != answer.id:
            return
        if body.stage_ms:
            answer.stage_ms.update(body.stage_ms)
            ttft_ms = body.stage_ms.get("llm_ttft_ms")
            if ttft_ms is not None:
                span = self._start("llm.first_token", answer.started_ns, answer.context)
                span.end(answer.started_ns + int(ttft_ms * 1e6))
        if body.audio_ms > 0 and not answer.first_audio:
            answer.first_audio = True
            span = self._start("tts.first_audio", answer.started_ns, answer.context)
            for name in ("tts_first_clause_ms", "first_clause_ready_ms"):
                if name in answer.stage_ms:
                    span.set_attribute(f"duplex.stage.{name}", answer.stage_ms[name])
            span.end(now)
        if body.text and not answer.first_text:
            answer.first_text = True
            answer.span.add_event("first_text", timestamp=now)
        if body.event_type == _TOOL_DONE:
            call = _decode_call(body.payload)
            span = self._start("tool_call", now, answer.context)
            span.set_attribute("duplex.tool.name", call.name)
            span.set_attribute("duplex.tool.call_id", call.call_id)
            self._tools[call.call_id] = span

    def _item(self, body: ItemBody, now: int, decided: int) -> None:
        """A tool call's output arrived: the client's tool call ends."""
        item = body.item
        if body.op != "create" or item is None or item.type != "function_call_output":
            return
        span = self._tools.pop(item.call_id or "", None)
        if span is not None:
            span.set_attribute("duplex.tool.answered", True)
            span.end(now)

    # --- spans -------------------------------------------------------------------

    def _start(self, name: str, at: int, context: object) -> Span:
        span = self._tracer.start_span(name, context, start_time=at)  # type: ignore[arg-type]
        if self._labels:
            span.set_attributes(self._labels)
        return span

    def _start_turn(self, at: int, item_id: str | None) -> None:
        self._turn = self._start("turn", at, self._root_context)
        if item_id is not None:
            self._turn.set_attribute("duplex.item.id", item_id)
        self._turn_context = trace.set_span_in_context(self._turn)

    def _end_turn(self, now: int) -> None:
        if self._stopped is not None:
            self._stopped.end(now)
            self._stopped = None
        if self._speech is not None:
            self._speech.end(now)
            self._speech = None
        if self._turn is not None:
            self._turn.end(now)
        self._turn, self._turn_context = None, self._root_context

    def _end_answer(self, now: int, status: str, reason: str = "") -> None:
        answer, self._answer = self._answer, None
        if answer is None:
            return
        figures = answer.stage_ms
        ttft_ms, pieces = figures.get("llm_ttft_ms"), figures.get("llm_output_pieces")
        if ttft_ms is not None and pieces is not None:
            # The whole answer: the last token came (pieces - 1) mean gaps after the first.
            last_ms = ttft_ms + figures.get("llm_tpot_ms", 0.0) * max(pieces - 1, 0)
            span = self._start("llm.answer", answer.started_ns, answer.context)
            span.set_attribute("duplex.llm.output_pieces", int(pieces))
            span.end(answer.started_ns + int(last_ms * 1e6))
        answer.span.set_attribute("duplex.response.status", status)
        if reason:
            answer.span.set_attribute("duplex.response.reason", reason)
        if status == "failed":
            answer.span.set_status(Status(StatusCode.ERROR, reason or None))
        answer.span.end(now)

    def _relabel(self, tracing: str | TracingConfig | None) -> None:
        """The session's OpenAI ``tracing`` field, on the session span and on
        every span started after it was set (a trace backend filters spans,
        not traces, by attribute)."""
        self._tracing = tracing
        labels: dict[str, AttributeValue] = {}
        if isinstance(tracing, str):
            labels["openai.tracing"] = tracing
        elif isinstance(tracing, TracingConfig):
            if isinstance(tracing.workflow_name, str):
                labels["openai.tracing.workflow_name"] = tracing.workflow_name
            if isinstance(tracing.group_id, str):
                labels["openai.tracing.group_id"] = tracing.group_id
            if isinstance(tracing.metadata, dict):
                for key, value in tracing.metadata.items():
                    labels[f"openai.tracing.metadata.{key}"] = value
        self._labels = labels
        if labels:
            self._root.set_attributes(labels)


# Unbound, so that a tracer holds no cycle through its own bound methods.
_HANDLERS: dict[type, Callable[[OtlpSessionTracer, Any, int, int], None]] = {
    DecisionBody: OtlpSessionTracer._decision,
    OutBody: OtlpSessionTracer._out,
    CommitBody: OtlpSessionTracer._commit,
    ItemBody: OtlpSessionTracer._item,
    FenceBody: OtlpSessionTracer._fence,
    CloseBody: OtlpSessionTracer._close_record,
}
