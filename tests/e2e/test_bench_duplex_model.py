"""``duplex-server bench duplex-model`` runs end to end on its tiny random
checkpoint with the fast step: a real server fed real-time audio over
WebSockets, the same step run directly, and one JSON report of the
documented shape. No wall-clock limit is judged: the machine's speed is not
under test (on a loaded CPU every tick may overrun, and says so)."""

from __future__ import annotations

import json
import subprocess
import sys

SESSIONS, FRAMES = 2, 4


def test_bench_duplex_model_reports_every_figure():
    command = [sys.executable, "-m", "duplex_server.cli", "bench", "duplex-model"]
    command += ["--sessions", str(SESSIONS), "--frames", str(FRAMES), "--moshi-step", "fast"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["bench"] == "duplex-model" and report["sessions"] == SESSIONS
    assert report["moshi_step"] == "fast" and isinstance(report["valid"], bool)
    server, direct = report["server"], report["direct"]
    assert server["frames_sent"] == SESSIONS * FRAMES and server["client_errors"] == []
    # the sessions stayed until the server had ticked every frame they sent
    assert server["ticks"] >= FRAMES
    assert 0 <= server["underruns"] <= server["ticks"]
    assert 0 < server["tick_ms_p50"] <= server["tick_ms_p99"] <= server["tick_ms_max_bucket"]
    assert server["generator_cpu_percent"] >= 0 and server["frames_per_s"] > 0
    assert direct["rows"] == SESSIONS and direct["frames"] == FRAMES
    assert 0 < direct["tick_ms_p50"] <= direct["tick_ms_p99"] <= direct["tick_ms_max"]
    assert 0 <= direct["underruns"] <= FRAMES and direct["frames_per_s"] > 0
    assert all(ratio > 0 for ratio in report["ratios"].values())
