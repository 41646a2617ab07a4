"""``duplex-server bench sessions`` runs end to end and says whether it
measured the server: the generator's CPU beside the server's, and a verdict."""

from __future__ import annotations

import json
import subprocess
import sys


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


def test_bench_sessions_reports_the_generator_and_a_verdict():
    report = bench("sessions", "--sessions", "4", "--seconds", "1", "--ramp-s", "0.2")
    assert report["bench"] == "sessions" and report["errors"] == 0
    for phase in (report, report["baseline_bare_echo"]):
        assert phase["generator_cpu_percent"] >= 0.0
        assert phase["generator_saturated"] == (phase["generator_cpu_percent"] >= 90.0)
    assert report["valid"] == (
        not report["generator_saturated"]
        and not report["baseline_bare_echo"]["generator_saturated"]
    )
    assert report["appends_per_s"] > 0


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
