"""Session traces: when they are on, what a start without the package does,
and the spans read off records that a spoken cascade turn does not make
(an LLM's token figures, tool calls, slow appends, a failed answer)."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from duplex_server.sessions.core.items import Item
from duplex_server.sessions.core.records import (
    CommitBody,
    DecisionBody,
    ItemBody,
    OutBody,
    Record,
)
from duplex_server.sessions.core.state import initial_state
from duplex_server.tracing import open_tracing
from duplex_server.tracing_otel import OtlpTracing
from protocol.session_config import TracingConfig

URL = "http://127.0.0.1:9/v1/traces"


def test_off_without_an_endpoint_or_when_the_sdk_is_disabled():
    assert open_tracing(None, {}, 5.0) is None
    assert open_tracing(URL, {"OTEL_SDK_DISABLED": "true"}, 5.0) is None
    on = open_tracing(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": URL}, 5.0)
    assert isinstance(on, OtlpTracing)
    on.shutdown()
    on.shutdown()  # the manager's second shutdown (a test's, then the lifespan's) is harmless


def test_a_server_not_asked_to_trace_never_imports_the_exporter():
    code = (
        "import sys\n"
        "from duplex_server.app import create_app\n"
        "from duplex_server.config import ServerConfig\n"
        "app = create_app(ServerConfig(model='echo', store='memory'))\n"
        "assert app.state.manager.settings.tracing is None\n"
        "assert 'duplex_server.tracing_otel' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("argv", "environ", "named"),
    [
        (["--otlp-traces-endpoint", URL], {}, "--otlp-traces-endpoint"),
        ([], {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": URL}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ],
)
def test_tracing_without_the_package_is_refused_at_start(argv, environ, named):
    """The start fails with the extra to install; a server without the
    package is otherwise unaffected (the test above)."""
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if not installed\n"
        "from duplex_server.cli import main\n"
        f"main(['serve', '--model', 'echo', '--store', 'memory', *{argv!r}])\n"
    )
    env = {"PATH": "/usr/bin:/bin", **environ}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 1, done.stderr
    assert f"duplex-server: {named} needs OpenTelemetry" in done.stderr
    assert "pip install 'duplex-server[otel]'" in done.stderr


def _out(seq: int, event_type: str, response_id: str, **fields) -> OutBody:
    return OutBody(seq, event_type, b"{}", response_id=response_id, **fields)


def _record(body) -> Record:
    return Record(0, 0, "server", body)


def test_llm_tool_call_slow_append_and_failure_spans():
    exporter = InMemorySpanExporter()
    tracing = OtlpTracing(None, {}, store_append_threshold_s=0.010, exporter=exporter)
    tracer = tracing.session("sess_1", "cascade")
    state = initial_state("sess_1", "cascade")
    state.config.tracing = TracingConfig(workflow_name="billing")
    call = msgspec.json.encode({"call_id": "call_1", "name": "lookup", "arguments": "{}"})
    tracer.landed(
        state,
        [
            _record(CommitBody("item_1", True, stage_ms={"asr_final_ms": 30.0})),
            _record(DecisionBody("speak", response_id="resp_1", modalities=["text"])),
        ],
        0.001,
    )
    figures = {"llm_ttft_ms": 40.0}
    tracer.landed(
        state,
        [_record(_out(1, "response.output_text.delta", "resp_1", text="Hi", stage_ms=figures))],
        0.0,
    )
    tool = OutBody(2, "response.function_call_arguments.done", call, response_id="resp_1")
    end = {"llm_output_pieces": 5.0, "llm_tpot_ms": 10.0}
    tracer.landed(
        state,
        [
            _record(tool),
            _record(_out(3, "response.done", "resp_1", stage_ms=end)),
            _record(DecisionBody("response_done", response_id="resp_1", status="completed")),
        ],
        0.050,  # a slow append: a span of its own
    )
    output = Item("item_2", type="function_call_output", call_id="call_1", output="{}")
    tracer.landed(state, [_record(ItemBody("create", "item_2", item=output))], 0.0)
    tracer.landed(state, [_record(DecisionBody("speak", response_id="resp_2"))], 0.0)
    tracer.landed(
        state,
        [_record(DecisionBody("response_done", "resp_2", status="failed", reason="engine_error"))],
        0.0,
    )
    tracer.closed("client_close")
    tracing.shutdown()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    root, turn = spans["session"], spans["turn"]
    assert root.attributes["openai.tracing.workflow_name"] == "billing"
    assert root.attributes["duplex.session.exit"] == "client_close"
    first = [s for s in exporter.get_finished_spans() if s.name == "response"]
    answered, failed = sorted(first, key=lambda s: s.start_time)
    assert answered.parent.span_id == turn.context.span_id  # the committed turn's answer
    assert failed.parent.span_id == root.context.span_id  # no turn open: the session's
    assert failed.status.status_code.name == "ERROR"
    assert failed.attributes["duplex.response.reason"] == "engine_error"
    ttft = spans["llm.first_token"]
    assert ttft.parent.span_id == answered.context.span_id
    assert ttft.end_time - ttft.start_time == 40_000_000
    whole = spans["llm.answer"]  # the last of 5 pieces came 4 mean gaps after the first
    assert whole.end_time - whole.start_time == 80_000_000
    assert whole.attributes["duplex.llm.output_pieces"] == 5
    tool_span = spans["tool_call"]
    assert tool_span.parent.span_id == answered.context.span_id
    assert tool_span.attributes["duplex.tool.name"] == "lookup"
    assert tool_span.attributes["duplex.tool.answered"] is True
    assert tool_span.attributes["openai.tracing.workflow_name"] == "billing"
    slow = [s for s in exporter.get_finished_spans() if s.name == "store.append"]
    assert len(slow) == 1 and slow[0].attributes["duplex.store.records"] == 3
    assert slow[0].end_time - slow[0].start_time == pytest.approx(50_000_000, abs=1)
    asr = spans["asr"]
    assert asr.parent.span_id == turn.context.span_id
    assert asr.end_time - asr.start_time == 30_000_000


def test_a_fault_in_the_trace_never_fails_the_append(caplog):
    exporter = InMemorySpanExporter()
    tracing = OtlpTracing(None, {}, 0.005, exporter=exporter)
    tracer = tracing.session("sess_2", "echo")
    state = initial_state("sess_2", "echo")
    bad = OutBody(1, "response.function_call_arguments.done", b"not json", response_id="r")
    tracer.landed(state, [_record(DecisionBody("speak", response_id="r"))], 0.0)
    tracer.landed(state, [_record(bad)], 0.0)  # does not raise
    assert "a batch's spans were not recorded" in caplog.text
    tracer.closed("client_close")
    tracing.shutdown()
    assert {span.name for span in exporter.get_finished_spans()} == {"session", "response"}
