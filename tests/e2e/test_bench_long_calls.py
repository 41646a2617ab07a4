"""``duplex-server bench soak --long-calls`` runs end to end: a short run on
Redis with ``--media-dir`` reports the store over time, refold times, the
server's append latencies and the heartbeat probe, the media it sealed out
of Redis, and a compressed call measured at its own length."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_soak_long_calls_on_redis_media_seals_audio_out_of_redis():
    out = subprocess.run(
        [
            *(sys.executable, "-m", "duplex_server.cli", "bench", "soak", "--long-calls"),
            *("--seconds", "10", "--sample-s", "2", "--stores", "redis-media"),
            *("--model", "echo", "--hour-call-s", "120", "--quiet"),
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
    # the server's append latencies, per window and by halves of the call
    assert all(s["store_append_count"] > 0 and s["append_count"] > 0 for s in samples[1:])
    latency = row["latency"]
    for key in ("store_append", "append"):
        first_half, second_half = latency[f"{key}_p99_ms_halves"]
        assert first_half > 0 and second_half > 0
        assert latency[f"{key}_p99_second_over_first"] == round(second_half / first_half, 3)
    assert latency["asr_p99_ms_halves"] == [None, None]  # the echo has no recogniser
    # the heartbeat probe answered; first and last are the windows that had answers
    first, last = latency["heartbeat_p99_ms_first_last"]
    answered = [s for s in samples[1:] if s["heartbeats"]]
    assert first == answered[0]["heartbeat_rtt_p99_ms"] > 0
    assert last == answered[-1]["heartbeat_rtt_p99_ms"] > 0
    assert latency["heartbeat_p99_last_over_first"] == round(last / first, 3)
    refold = row["refold"]
    long, tiny = refold["long_session"], refold["tiny_session"]
    assert long["restore_records"] > tiny["restore_records"] > 0
    assert long["events"] > tiny["events"] > 0 and long["events_route_ms"] > 0
    assert "full_fold_ms" not in long  # archives need the media dir: the events route reads them
    assert refold["restore_ms_one_hour_extrapolated"] >= tiny["restore_ms"]
    # the compressed call: 120 s of audio, a commit each 2 s, every answer logged
    hour = row["hour_call"]
    assert (hour["call_s"], hour["appends"], hour["answers"]) == (120.0, 1200, 60)
    assert hour["errors"] == 0, hour["first_error"]
    assert hour["growth_bytes"]["media_dir_bytes"] > 0
    assert hour["growth_mb_per_session_hour"]["redis_used_memory_delta_bytes"] == round(
        hour["growth_bytes"]["redis_used_memory_delta_bytes"] / 1e6 * 3600 / 120, 2
    )
    measured = refold["hour_session"]
    assert measured["call_s"] == 120.0 and measured["events"] == hour["events"] > long["events"]
    assert 0 < measured["snapshot_seq"] <= measured["events"]  # restored from a snapshot
    assert measured["restore_records"] < measured["events"]
    targets = row["targets"]
    assert set(targets) == {
        "store_append_p99_second_half_over_first_at_most_1_5",
        "append_p99_second_half_over_first_at_most_1_5",
        "restore_one_hour_under_1_s_extrapolated",
        "redis_memory_under_20_mb_per_session_hour",
        "redis_memory_under_20_mb_per_session_hour_hour_call",
    }  # no measured one-hour target: this call was 120 s
    assert targets["redis_memory_under_20_mb_per_session_hour"] == (
        slopes["redis_used_memory_delta_bytes"] < 20.0
    )
