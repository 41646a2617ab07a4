"""``duplex-server bench batch`` runs and reports both phases of one run."""

from __future__ import annotations

import json

from tests.e2e.serverproc import run_cli


def test_bench_batch_times_realtime_answers_alone_and_beside_batch_speech():
    done = run_cli(
        "duplex_server.cli", "bench", "batch", "--turns", "4", "--batch-clients", "1", timeout_s=300
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["bench"] == "batch" and report["turns"] == 4
    base, loaded = report["baseline"], report["with_batch"]
    assert base["first_audio"]["count"] == loaded["first_audio"]["count"] == 4
    assert base["batch_jobs"] == 0 and loaded["batch_jobs"] > 0 and loaded["batch_failures"] == 0
    assert loaded["batch_audio_s_per_s"] > 0
    assert report["p99_ratio"] == round(
        loaded["first_audio"]["p99_ms"] / base["first_audio"]["p99_ms"], 2
    )
    assert "generator_cpu_percent" in loaded and "server_cpu_percent" in loaded
    assert isinstance(report["valid"], bool)
