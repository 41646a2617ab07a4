"""Session traces for an OpenTelemetry collector: optional, and free when off.

With ``--otlp-traces-endpoint`` (or the SDK's own
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) each session is exported as one
trace: a ``session`` span, a ``turn`` span per user turn and, under them,
what the turn took (VAD, ASR, the answer's first token and first audio,
tool calls, slow store appends); docs/operations/tracing.md lists them.
The spans are read off the records as they land, the one place every
session's facts pass in order, so the session core stays free of it and
the models need no hook of their own.

Off, the manager hands actors no tracer (``None``): the log writer's one
hook is an ``is not None`` test per append. opentelemetry is imported only
when tracing is on (``duplex_server/tracing_otel.py``): it is an optional
extra, and a server without it starts normally unless asked to trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from duplex_server.sessions.core.records import Record
from duplex_server.sessions.core.state import SessionState

# The SDK's own variable for the traces endpoint; the option wins over it.
ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
MISSING_PACKAGE = (
    "{what} needs OpenTelemetry's SDK and OTLP/HTTP exporter: pip install 'duplex-server[otel]'"
)


class SessionTracer(Protocol):
    """One session's trace, fed by the session's runtime shell."""

    def landed(self, state: SessionState, records: list[Record], append_s: float) -> None:
        """A batch was appended (``append_s``: how long the store took);
        ``state`` is the fold with it applied."""
        ...

    def closed(self, reason: str) -> None:
        """The actor ended (how the session ended, or why it stopped
        serving here): every open span ends."""
        ...


class Tracing(Protocol):
    """The server's exporter: a tracer per session, flushed at shutdown."""

    def session(self, session_id: str, model: str) -> SessionTracer: ...

    def shutdown(self) -> None:
        """Export what is still queued, then stop (blocking: run it off the loop)."""
        ...


def open_tracing(
    endpoint: str | None, environ: Mapping[str, str], store_append_threshold_ms: float
) -> Tracing | None:
    """The exporter the settings ask for; None (no tracer, nothing
    exported, opentelemetry not imported) when no endpoint is given or
    ``OTEL_SDK_DISABLED`` is true. Raises ValueError, refusing the start,
    when one is asked for and the optional extra is not installed."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    what = "--otlp-traces-endpoint"
    if endpoint is None and environ.get(ENDPOINT_VARIABLE):
        endpoint, what = environ[ENDPOINT_VARIABLE], ENDPOINT_VARIABLE
    if endpoint is None:
        return None
    try:
        from duplex_server import tracing_otel
    except ImportError as exc:
        raise ValueError(MISSING_PACKAGE.format(what=what)) from exc
    return tracing_otel.OtlpTracing(endpoint, environ, store_append_threshold_ms / 1000)
