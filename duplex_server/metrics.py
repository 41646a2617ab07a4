"""The series an operator of a voice server watches, through ``prometheus_client``.

The metric objects are module-level, as in most Prometheus-instrumented
servers: the code that knows a number records it where it happens (the
actor, the connection, a cascade stage, the engine), and nothing passes a
metrics object around. This module is a leaf: it imports nothing of the
server, so every layer may import it.

A scrape is served from a registry built per app (:func:`app_registry`):
the shared series, the process, GC and platform collectors, the app's own
gauges, read when scraped (live sessions by model), and whatever libraries
registered in ``prometheus_client``'s global registry (vLLM's ``vllm:*``). Two apps in
one process (the tests) share the counters and keep their own gauges.
docs/decisions/metrics.md lists the series and how each is measured; the Grafana
dashboard in deploy/grafana-dashboard.json plots them.
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
from collections.abc import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

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
    10.0,
)
# Processing time over audio time: under 1 keeps up with a live voice.
REALTIME_RATIO_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST
# A ``_created`` twin of every counter and histogram doubles the exposition
# for a timestamp no dashboard here reads.
disable_created_metrics()

# --- sessions and admission ---------------------------------------------------

SESSIONS_OPENED = Counter("duplex_sessions_opened", "sessions opened", ["model"], registry=None)
ADMISSIONS_REFUSED = Counter(
    "duplex_admissions_refused",
    "connections or sessions refused before a session opened, by reason",
    ["reason"],
    registry=None,
)
RESUMES = Counter(
    "duplex_resumes",
    "session.resume requests by outcome (resumed, or the error code)",
    ["outcome"],
    registry=None,
)
TAKEOVERS = Counter(
    "duplex_takeovers",
    "sessions taken over from another replica (shared stores)",
    registry=None,
)

# --- client input and the log --------------------------------------------------

CLIENT_EVENTS = Counter(
    "duplex_client_events", "client events received, by type", ["type"], registry=None
)
APPEND_LATENCY = Histogram(
    "duplex_append_latency_seconds",
    "client frame received -> its records appended to the session log",
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
STORE_APPEND_LATENCY = Histogram(
    "duplex_store_append_seconds",
    "one batch's append to the session store, durable when it returns",
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
STORE_ERRORS = Counter(
    "duplex_store_errors",
    "session store operations that failed, by operation",
    ["operation"],
    registry=None,
)

# --- what a listener hears ------------------------------------------------------

COMMIT_TO_FIRST_AUDIO = Histogram(
    "duplex_commit_to_first_audio_seconds",
    "input_audio_buffer.commit received -> the answer's first audio recorded",
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
SPEECH_STOPPED_TO_FIRST_AUDIO = Histogram(
    "duplex_speech_stopped_to_first_audio_seconds",
    "server VAD heard the end of speech -> the answer's first audio recorded",
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
BARGE_IN_TO_SILENCE = Histogram(
    "duplex_barge_in_to_silence_seconds",
    "frame that barged in received -> the answer's audio fenced off",
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
AUDIO_UNDERRUNS = Counter(
    "duplex_audio_underruns",
    "answers whose next audio came after what was sent before it had played out",
    registry=None,
)

# --- the build ----------------------------------------------------------------


def build() -> dict[str, str]:
    """What ``duplex_build_info`` and ``GET /version`` say. A checkout run
    without being installed (``PYTHONPATH=.``) has no version to read: it
    says so rather than failing to import."""
    try:
        version = importlib.metadata.version("duplex-server")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    return {"version": version, "python": platform.python_version()}


BUILD = Info("duplex_build", "the server's version and the Python it runs on", registry=None)
BUILD.info(build())

# --- WebRTC calls --------------------------------------------------------------

RTC_FRAME_LATENESS = Histogram(
    "duplex_rtc_frame_lateness_seconds",
    "a WebRTC call's outbound 20 ms audio frame handed to its track -> after its due time",
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
RTC_UNDERRUNS = Counter(
    "duplex_rtc_underruns",
    "WebRTC outbound audio frames handed over more than a frame (20 ms) late",
    registry=None,
)
RTC_CALLS = Counter(
    "duplex_rtc_calls",
    "POST /v1/realtime/calls by outcome (connected, resumed, or why not)",
    ["outcome"],
    registry=None,
)

# --- the engine ----------------------------------------------------------------

STAGE_LATENCY = Histogram(
    "duplex_stage_seconds",
    "one call of a model stage (asr, tts, llm, vad), queueing included",
    ["stage"],
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
STAGE_REALTIME_RATIO = Histogram(
    "duplex_stage_realtime_ratio",
    "a stage call's time over the audio it heard or made",
    ["stage"],
    buckets=REALTIME_RATIO_BUCKETS,
    registry=None,
)
ENGINE_QUEUE_DEPTH = Gauge(
    "duplex_engine_queue_depth",
    "requests waiting for an engine slot, by engine",
    ["engine"],
    registry=None,
)
MODEL_TICK = Histogram(
    "duplex_model_tick_seconds",
    "one frame-synchronous tick of a native duplex model (all its sessions' 80 ms frame)",
    ["model"],
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
MODEL_TICK_OVERRUNS = Counter(
    "duplex_model_tick_overruns",
    "ticks of a native duplex model longer than the 80 ms frame they stand for",
    ["model"],
    registry=None,
)
LLM_TTFT = Histogram(
    "duplex_llm_ttft_seconds",
    "an LLM answer submitted -> its first token back (queueing and prefill included)",
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
LLM_TPOT = Histogram(
    "duplex_llm_tpot_seconds",
    "an LLM answer's mean time per output token after its first",
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
LLM_INTER_TOKEN = Histogram(
    "duplex_llm_inter_token_seconds",
    "the time between two consecutive streamed pieces of an LLM answer",
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
LLM_REMOTE_REQUESTS = Counter(
    "duplex_llm_remote_requests",
    "requests to the remote LLM (--llm-url), by outcome: completed, aborted (a fence "
    "closed the stream), failed, retried (a try before the answer began)",
    ["outcome"],
    registry=None,
)

# --- batch jobs --------------------------------------------------------------

# A batch job runs for a fraction of a second (a short speech) to minutes (a video).
JOB_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
BATCH_JOBS = Counter(
    "duplex_batch_jobs",
    "batch jobs ended, by route and outcome (completed, the error code it failed with, "
    "replayed: answered from the log without running)",
    ["route", "outcome"],
    registry=None,
)
BATCH_JOB_SECONDS = Histogram(
    "duplex_batch_job_seconds",
    "one batch job's run in this process, from its start to its result recorded, by route",
    ["route"],
    buckets=JOB_BUCKETS_S,
    registry=None,
)
BATCH_QUEUE_DEPTH = Gauge(
    "duplex_batch_queue_depth",
    "batch jobs admitted in this process and not finished (running, or waiting for the engine)",
    registry=None,
)

SHARED = (
    BUILD,
    BATCH_JOBS,
    BATCH_JOB_SECONDS,
    BATCH_QUEUE_DEPTH,
    RTC_FRAME_LATENESS,
    RTC_UNDERRUNS,
    RTC_CALLS,
    SESSIONS_OPENED,
    ADMISSIONS_REFUSED,
    RESUMES,
    TAKEOVERS,
    CLIENT_EVENTS,
    APPEND_LATENCY,
    STORE_APPEND_LATENCY,
    STORE_ERRORS,
    COMMIT_TO_FIRST_AUDIO,
    SPEECH_STOPPED_TO_FIRST_AUDIO,
    BARGE_IN_TO_SILENCE,
    AUDIO_UNDERRUNS,
    STAGE_LATENCY,
    STAGE_REALTIME_RATIO,
    ENGINE_QUEUE_DEPTH,
    MODEL_TICK,
    MODEL_TICK_OVERRUNS,
    LLM_TTFT,
    LLM_TPOT,
    LLM_INTER_TOKEN,
    LLM_REMOTE_REQUESTS,
)


class LiveSessions(Collector):
    """``duplex_sessions_live{model}``, counted when scraped."""

    def __init__(self, live_by_model: Callable[[], dict[str, int]]) -> None:
        self._live_by_model = live_by_model

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "duplex_sessions_live", "sessions with a live actor, by model", labels=["model"]
        )
        for model, count in sorted(self._live_by_model().items()):
            family.add_metric([model], count)
        yield family


STANDARD = (PROCESS_COLLECTOR, GC_COLLECTOR, PLATFORM_COLLECTOR)


class GlobalRegistry(Collector):
    """What libraries in this process register in ``prometheus_client``'s
    global registry, read when scraped: vLLM's stat loggers (the ``vllm:*``
    series of an in-process ``AsyncLLM``) register there, and there only. The
    standard collectors, which are there too, are left out: the app registry
    has them itself."""

    def describe(self) -> Iterator[Metric]:
        # Nothing to describe: what it holds changes as libraries load (vLLM
        # registers its series when its engine starts, after the app was built).
        return iter(())

    def collect(self) -> Iterator[Metric]:
        own = {family.name for collector in STANDARD for family in collector.collect()}
        for family in REGISTRY.collect():
            if family.name not in own:
                yield family


def app_registry(live_by_model: Callable[[], dict[str, int]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    for collector in (*STANDARD, *SHARED):
        registry.register(collector)
    registry.register(LiveSessions(live_by_model))
    registry.register(GlobalRegistry())
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def observe_stage(stage: str, seconds: float, audio_s: float) -> None:
    """One stage call: its latency, and its real-time factor when it had audio."""
    STAGE_LATENCY.labels(stage).observe(seconds)
    if audio_s > 0:
        STAGE_REALTIME_RATIO.labels(stage).observe(seconds / audio_s)


# --- reading an exposition (benches) -------------------------------------------


def parse_histogram(
    text: str, name: str, labels: dict[str, str] | None = None
) -> list[tuple[float, int]]:
    """``[(upper_bound, cumulative_count)]`` of one histogram in exposition
    text (of the series with ``labels``, where it has labels), read with
    ``prometheus_client``'s parser."""
    wanted = labels or {}
    for family in text_string_to_metric_families(text):
        if family.name == name and family.type == "histogram":
            return [
                (float(sample.labels["le"]), int(sample.value))
                for sample in family.samples
                if sample.name == f"{name}_bucket"
                and all(sample.labels.get(k) == v for k, v in wanted.items())
            ]
    return []


def sample_value(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """One sample's value in exposition text (a counter's ``_total``, a gauge)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and (labels is None or sample.labels == labels):
                return sample.value
    return None


def histogram_quantile(buckets: list[tuple[float, int]], q: float) -> float | None:
    """Prometheus-style quantile with linear interpolation inside the bucket."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            span = count - lower_count
            fraction = (rank - lower_count) / span if span else 0.0
            return lower_bound + (bound - lower_bound) * fraction
        lower_bound, lower_count = bound, count
    return lower_bound
