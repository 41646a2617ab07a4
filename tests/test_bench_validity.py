"""A bench run is valid only while its load generator had room to spare."""

from __future__ import annotations

from duplex_server.bench.generator import GeneratorCpu, validity


def test_a_saturated_generator_makes_the_run_invalid():
    calm = {"generator_cpu_percent": 40.0, "generator_saturated": False}
    busy = {"generator_cpu_percent": 97.0, "generator_saturated": True}
    assert validity(calm, calm) == {"valid": True, "invalid_reason": None}
    verdict = validity(calm, busy)
    assert verdict["valid"] is False and "phase 1" in verdict["invalid_reason"]


def test_the_generator_reports_its_own_cpu():
    generator = GeneratorCpu()
    generator.start()
    sum(i * i for i in range(200_000))  # some work of this process's own
    report = generator.report()
    assert report["generator_cpu_percent"] > 0.0
    assert report["generator_saturated"] == (report["generator_cpu_percent"] >= 90.0)
