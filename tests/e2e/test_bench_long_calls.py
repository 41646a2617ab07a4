"""``duplex-server bench soak --long-calls`` runs end to end: a short run on
Redis with ``--media-dir`` reports the store over time, refold times and the
heartbeat probe, and the media it sealed out of Redis."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_soak_long_calls_on_redis_media_seals_audio_out_of_redis():
    out = subprocess.run(
        [
            *(sys.executable, "-m", "duplex_server.cli", "bench", "soak", "--long-calls"),
            *("--seconds", "10", "--sample-s", "2", "--stores", "redis-media"),
            *("--model", "echo", "--quiet"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    report = json.loads(out.stdout)
    assert report["bench"] == "soak" and report["mode"] == "long-calls"
    assert report["calls"] == 2 and report["model"] == "echo"
    [row] = report["stores"]
    assert row["store"] == "redis-media" and row["retain_audio"] == "all"
    assert row["errors"] == 0, row["first_error"]
    assert row["appends"] > 0 and row["answers"] > 0  # the echo answered each commit
    assert row["valid"] == (not any(s["generator_saturated"] for s in row["samples"][1:]))
    # the store over time: the first sample before any call, then one per window
    samples = row["samples"]
    assert samples[0]["t_s"] == 0.0 and len(samples) >= 4
    assert all("redis_used_memory_delta_bytes" in s and "media_dir_bytes" in s for s in samples)
    assert [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples)
    # the sealer wrote segments: the media directory holds the calls' audio
    assert row["media_dir_files"] > 0 and row["final"]["media_dir_bytes"] > 0
    assert samples[-1]["media_dir_bytes"] > samples[0]["media_dir_bytes"]
    slopes = row["slope_mb_per_session_hour"]
    assert set(slopes) == {"redis_used_memory_delta_bytes", "media_dir_bytes"}
    assert all(isinstance(v, float) for v in slopes.values())
    # the heartbeat probe answered; first and last are the windows that had answers
    first, last = row["heartbeat_p99_ms_first_last"]
    answered = [s for s in samples[1:] if s["heartbeats"]]
    assert first == answered[0]["heartbeat_rtt_p99_ms"] > 0
    assert last == answered[-1]["heartbeat_rtt_p99_ms"] > 0
    assert row["heartbeat_p99_last_over_first"] == round(last / first, 3)
    refold = row["refold"]
    long, tiny = refold["long_session"], refold["tiny_session"]
    assert long["restore_records"] > tiny["restore_records"] > 0
    assert long["events"] > tiny["events"] > 0 and long["events_route_ms"] > 0
    assert "full_fold_ms" not in long  # archives need the media dir: the events route reads them
    assert refold["one_hour"].startswith("not measured at one hour")
    assert refold["restore_ms_one_hour_extrapolated"] >= tiny["restore_ms"]
    targets = row["targets"]
    assert set(targets) == {
        "heartbeat_p99_last_over_first_at_most_1_5",
        "restore_one_hour_under_1_s_extrapolated",
        "redis_memory_under_20_mb_per_session_hour",
    }
    assert targets["redis_memory_under_20_mb_per_session_hour"] == (
        slopes["redis_used_memory_delta_bytes"] < 20.0
    )
