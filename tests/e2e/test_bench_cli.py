"""``duplex-server bench sessions`` runs end to end and says whether it
measured the server: the generator's CPU beside the server's, and a verdict."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_sessions_reports_the_generator_and_a_verdict():
    out = subprocess.run(
        [sys.executable, "-m", "duplex_server.cli", "bench", "sessions"]
        + ["--sessions", "4", "--seconds", "1", "--ramp-s", "0.2"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    report = json.loads(out.stdout)
    assert report["bench"] == "sessions" and report["errors"] == 0
    for phase in (report, report["baseline_bare_echo"]):
        assert phase["generator_cpu_percent"] >= 0.0
        assert phase["generator_saturated"] == (phase["generator_cpu_percent"] >= 90.0)
    assert report["valid"] == (
        not report["generator_saturated"]
        and not report["baseline_bare_echo"]["generator_saturated"]
    )
    assert report["appends_per_s"] > 0
