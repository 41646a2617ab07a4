"""``duplex-server bench fuzz`` runs end to end and passes: no server
exception, every heartbeat answered, every error coded, every log whole."""

from __future__ import annotations

import json

from tests.e2e.serverproc import run_cli


def test_bench_fuzz_passes():
    out = run_cli("duplex_server.cli", "bench", "fuzz", "--frames", "300", timeout_s=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["bench"] == "fuzz" and report["frames_sent"] == 300
    assert report["server_exceptions"] == 0, report["first_server_exception"]
    assert report["heartbeat_failures"] == 0 and report["faults"] == 0, report["first_faults"]
    assert report["passed"] is True
    assert report["errors_by_code"], "300 fuzzed frames and not one refused"
    assert report["generator_saturated"] == (report["generator_cpu_percent"] >= 90.0)
