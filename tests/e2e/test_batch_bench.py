"""``duplex-server bench batch`` runs every part of one run and reports them:
streamed speech, image steps/s through the server against the same tiny
pipeline called directly, and realtime first-audio alone, beside batch
speech and beside image jobs."""

from __future__ import annotations

import json

import pytest

from tests.e2e.serverproc import run_cli

TURNS = 4


@pytest.fixture(scope="module")
def report() -> dict:
    done = run_cli(
        "duplex_server.cli",
        "bench",
        "batch",
        *("--turns", str(TURNS), "--batch-clients", "1", "--speech-requests", "2"),
        *("--image-shape", "tiny", "--image-steps", "2", "--image-jobs", "2"),
        *("--image-clients", "1"),
        timeout_s=600,  # a hang guard, not a measurement
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_bench_batch_times_realtime_answers_alone_and_beside_batch_speech(report):
    assert report["bench"] == "batch" and report["turns"] == TURNS
    base, loaded = report["baseline"], report["with_batch"]
    assert base["first_audio"]["count"] == loaded["first_audio"]["count"] == TURNS
    assert base["batch_jobs"] == 0 and loaded["batch_jobs"] > 0 and loaded["batch_failures"] == 0
    assert loaded["batch_audio_s_per_s"] > 0
    assert report["p99_ratio"] == round(
        loaded["first_audio"]["p99_ms"] / base["first_audio"]["p99_ms"], 2
    )
    assert "generator_cpu_percent" in loaded and "server_cpu_percent" in loaded
    assert isinstance(report["valid"], bool)
    assert [len(report["load_average"][at]) for at in ("start", "end")] == [3, 3]


def test_streamed_speech_reports_first_byte_and_real_time_factor(report):
    speech = report["speech"]
    assert speech["requests"] == speech["first_byte"]["count"] == 2
    assert speech["response_format"] == "mp3" and speech["audio_s_per_request"] > 1.0
    assert 0 < speech["real_time_factor_p50"] <= speech["real_time_factor_max"]
    # The first byte came before the whole response (wall = factor x audio seconds).
    whole_ms = speech["real_time_factor_max"] * speech["audio_s_per_request"] * 1000
    assert 0 < speech["first_byte"]["p50_ms"] <= speech["first_byte"]["max_ms"] <= whole_ms * 1.02


def test_image_steps_through_the_server_against_the_pipeline_called_directly(report):
    images = report["images"]
    assert (images["size"], images["steps"], images["n"], images["jobs_per_side"]) == (
        "16x16",
        2,
        1,
        2,
    )
    server, direct = images["server"], images["direct"]
    assert server["steps_per_s"] > 0 and direct["steps_per_s"] > 0
    assert images["ratio"] == pytest.approx(server["steps_per_s"] / direct["steps_per_s"], rel=0.01)
    assert images["fastest_ratio"] == pytest.approx(
        direct["min_job_s"] / server["min_job_s"], rel=0.01, abs=0.02
    )
    assert images["overhead_percent"] == pytest.approx((1 - images["ratio"]) * 100, abs=0.2)
    assert images["overhead_target_met"] == (images["overhead_percent"] <= 5.0)
    assert images["server_cpu_s_per_job"] > 0 and images["direct_cpu_s_per_job"] > 0
    assert images["cpu_overhead_percent"] == pytest.approx(
        (images["server_cpu_s_per_job"] / images["direct_cpu_s_per_job"] - 1) * 100, abs=5
    )
    # The same job painted the same pictures on both sides: the same computation was timed.
    assert images["max_pixel_difference"] <= 1


def test_image_throughput_with_the_route_kept_busy_against_back_to_back_calls(report):
    busy = report["images"]["throughput"]
    assert (busy["jobs_per_side"], busy["clients"]) == (4, 2)
    assert busy["server_steps_per_s"] > 0 and busy["direct_steps_per_s"] > 0
    assert busy["ratio"] == pytest.approx(
        busy["server_steps_per_s"] / busy["direct_steps_per_s"], rel=0.01
    )
    assert busy["overhead_percent"] == pytest.approx((1 - busy["ratio"]) * 100, abs=0.2)
    assert busy["overhead_target_met"] == (busy["overhead_percent"] <= 5.0)


def test_realtime_first_audio_while_images_render(report):
    base, painting = report["baseline"], report["with_images"]
    assert painting["first_audio"]["count"] == TURNS
    assert painting["image_clients"] == 1
    assert painting["image_jobs"] > 0 and painting["image_failures"] == 0
    assert painting["image_steps_per_s"] > 0
    assert report["images_p99_ratio"] == round(
        painting["first_audio"]["p99_ms"] / base["first_audio"]["p99_ms"], 2
    )
    assert "generator_cpu_percent" in painting and painting["server_cpu_percent"] >= 0
