"""``duplex-server bench sessions`` (and soak and chaos) run end to end and say
whether they measured the server: the generators' CPU beside the server's,
and a verdict."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def bench(*argv: str) -> dict:
    """Run ``duplex-server bench ARGV`` as a user would; its JSON line."""
    out = subprocess.run(
        [sys.executable, "-m", "duplex_server.cli", "bench", *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(out.stdout)


def test_bench_sessions_reports_the_generators_the_cpu_cost_and_a_verdict():
    """Two generator processes: each one's CPU, the server's CPU per
    session-second in both phases, their ratio (the headline), a verdict.
    (Enough load that the bare echo server's CPU, counted in 10 ms ticks,
    is more than nothing.)"""
    sessions = 10
    report = bench(
        *("sessions", "--sessions", str(sessions), "--seconds", "2", "--ramp-s", "0.5"),
        *("--generators", "2"),
    )
    assert report["bench"] == "sessions" and report["errors"] == 0
    assert report["generators"] == 2
    assert report["pinning"]["pinned"] == (report["server_cores"] > 0)
    per_session = "server_cpu_ms_per_session_second"
    for phase in (report, report["baseline_bare_echo"]):
        processes = phase["generator_processes"]
        assert len(processes) == 2 and sum(p["sessions"] for p in processes) == sessions
        assert all(p["cpu_ms"] > 0 and p["busy_percent"] > 0 for p in processes)
        assert phase["generator_cpu_percent"] == max(p["busy_percent"] for p in processes)
        assert phase["generator_saturated"] == bool(phase["generator_reasons"])
        if any(p["busy_percent"] > 80.0 for p in processes):
            assert phase["generator_saturated"]
        assert phase[per_session] > 0
        assert phase[per_session] == pytest.approx(
            phase["server_cpu_ms"] / (sessions * phase["server_window_s"]), rel=0.01
        )
    echo = report["baseline_bare_echo"][per_session]
    assert report["cpu_per_session_ratio"] == pytest.approx(report[per_session] / echo, abs=1e-3)
    reasons = report["generator_reasons"] + report["baseline_bare_echo"]["generator_reasons"]
    assert report["invalid_reasons"] == reasons
    assert report["valid"] == (not reasons)
    assert report["appends_per_s"] > 0


def test_bench_sessions_finds_a_capacity_in_bounded_probes():
    """Two short probes from one session: doubling, each judged against 50 ms."""
    report = bench(
        *("sessions", "--find-capacity", "--sessions", "1", "--max-probes", "2"),
        *("--seconds", "1", "--ramp-s", "0.2", "--generators", "1"),
    )
    probes = report["probes"]
    assert [p["sessions"] for p in probes][:1] == [1] and len(probes) <= 2
    for probe in probes:
        p99 = probe["commit_to_first_audio_ms"]["p99"]
        assert probe["passed"] == (
            not probe["generator_saturated"] and p99 is not None and p99 < 50.0
        )
    passed = [p["sessions"] for p in probes if p["passed"]]
    assert report["capacity_sessions"] == (max(passed) if passed else None)
    if passed and report["server_cores"]:
        assert report["capacity_sessions_per_server_core"] == pytest.approx(
            max(passed) / report["server_cores"], abs=0.1
        )


def test_bench_soak_samples_the_server_and_draws_the_plot(tmp_path):
    """A short soak on SQLite: every sample counts sessions served and the
    server's RSS, fds and store size; the slope is fitted and the plot drawn."""
    plot = tmp_path / "soak.png"
    report = bench(
        *("soak", "--store", "sqlite", "--sessions", "300", "--churn-clients", "4"),
        *("--streaming", "1", "--sample-s", "0.3", "--plot", str(plot)),
    )
    assert report["bench"] == "soak" and report["sessions_failed"] == 0
    samples = report["samples"]
    assert report["sessions_served"] == samples[-1]["sessions_served"] >= 300
    served = [s["sessions_served"] for s in samples]
    assert served == sorted(served)
    assert all(s["rss_mib"] > 0 and s["open_fds"] > 0 and s["store_bytes"] > 0 for s in samples)
    assert samples[-1]["commit_to_first_audio_ms"]["p99"] > 0
    if len(samples) >= 5:
        assert isinstance(report["rss_slope_mb_per_1000_sessions"], float)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_soak_prices_a_live_session():
    """The live phase alone: the RSS and store bytes a streaming session adds."""
    report = bench(
        *("soak", "--store", "sqlite", "--sessions", "0", "--live-sessions", "3", "--live-s", "2")
    )
    live = report["live"]
    assert "sessions_served" not in report  # no churn was asked for
    assert live["live_sessions"] == 3 and live["errors"] == 0 and live["connect_failures"] == 0
    before, peak = live["rss_mib_before_peak"]
    assert peak >= before > 0
    # before and peak are rounded to 0.1 MiB in the report; the per-session figure is not
    assert abs(live["memory_per_live_session_mib"] - (peak - before) / 3) < 0.1
    assert live["store_mib_per_session_minute"] > 0  # their audio reached the file


SHORT_CHAOS = (
    "--clients", "6", "--faults", "4", "--warmup-s", "1", "--min-gap-s", "0.5",
    "--max-gap-s", "1.5", "--max-hold-s", "1", "--settle-s", "2", "--seed", "7",
)  # fmt: skip


def test_bench_chaos_loses_nothing_acknowledged_on_sqlite(tmp_path):
    """The short seeded chaos run: kill -9, a full disk, a revoked database
    and dropped sockets on SQLite, one each; every client resumes and every
    log holds what its client was acknowledged."""
    plot = tmp_path / "chaos.png"
    report = bench("chaos", "--deployment", "sqlite", *SHORT_CHAOS, "--plot", str(plot))
    (sqlite,) = report["deployments"]
    assert sqlite["faults_injected"] == {"kill9": 1, "disk_full": 1, "revoke": 1, "socket_drop": 1}
    assert sqlite["resumes"] >= 6  # the kill -9 alone moves every client
    assert sqlite["refused_during_outages"] > 0  # the full disk and the revoked file were felt
    assert sqlite["acknowledged"] > 0 and sqlite["sessions_failed"] == {}
    assert sqlite["findings"]["records_lost"] == 0
    assert report["passed"], sqlite["findings"]
    assert plot.stat().st_size > 0


def test_bench_chaos_loses_nothing_acknowledged_on_two_replicas(tmp_path):
    """Two replicas on one Redis: a replica killed, Redis restarted, sockets dropped."""
    report = bench("chaos", "--deployment", "replicas", *SHORT_CHAOS)
    (replicas,) = report["deployments"]
    assert set(replicas["faults_injected"]) == {"replica_kill", "redis_restart", "socket_drop"}
    assert replicas["resumes"] >= 1 and replicas["sessions_failed"] == {}
    assert replicas["findings"]["records_lost"] == 0
    assert report["passed"], replicas["findings"]
