"""``duplex-server bench llm`` runs end to end (its own tiny model trained,
a server with ``--llm``, direct calls, text and spoken sessions) and prints
one JSON report of the documented shape, with figures that make sense.
No wall-clock limit is judged: the machine's speed is not under test."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_llm_reports_every_figure():
    command = [sys.executable, "-m", "duplex_server.cli", "bench", "llm"]
    command += ["--sessions", "4", "--repeats", "1", "--voice-sessions", "1", "--voice-turns", "1"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["bench"] == "llm" and report["sessions"] == 4
    assert isinstance(report["valid"], bool) and len(report["load_average"]) == 3
    # greedy on both paths: the server's sessions got the direct calls' answers
    assert report["same_answers"] is True
    direct, ours = report["direct"], report["ours"]
    for phase in (direct, ours):
        assert phase["chars"] > 0 and phase["chars_per_s"] > 0
        assert phase["ttft_alone_ms"]["n"] == 4  # each of the 4 prompts once
        assert 0 < phase["ttft_alone_ms"]["p50"] <= phase["ttft_alone_ms"]["p95"]
    assert direct["bench_process_cpu_percent"] > 0 and ours["generator_cpu_percent"] >= 0
    assert direct["chars"] == ours["chars"]
    assert direct["decode_steps"] > 0 and direct["decode_step_ms_mean"] > 0
    assert ours["server_cpu_percent"] > 0
    abort = ours["abort"]
    assert abort["cancels"] == 4 and 0 <= abort["cancelled_mid_answer"] <= 4
    assert abort["abort_to_silence_ms"]["n"] <= 4
    voice = report["voice_to_voice"]
    stopped = voice["vad_stopped_to_first_audio_ms"]
    assert stopped["n"] == 1 and stopped["p50"] > 0 and voice["answers"] == 2
    targets = report["targets"]
    assert set(targets) == {
        "ttft_overhead",
        "ttft_overhead_at_most_5_percent",
        "throughput_ratio",
        "throughput_at_least_0_95",
        "abort_limit_ms",
        "abort_to_silence_p99_within_one_step_plus_5ms",
        "voice_to_voice_p95_under_250ms",
    }
    assert targets["throughput_ratio"] > 0
    verdicts = [
        "ttft_overhead_at_most_5_percent",
        "throughput_at_least_0_95",
        "abort_to_silence_p99_within_one_step_plus_5ms",
        "voice_to_voice_p95_under_250ms",
    ]
    assert all(isinstance(targets[name], bool) for name in verdicts)
