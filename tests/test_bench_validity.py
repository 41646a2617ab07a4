"""A bench run is valid only while its load generator had room to spare."""

from __future__ import annotations

import psutil

from duplex_bench.generator import (
    GeneratorCpu,
    ProcessCpu,
    busy_reasons,
    validity,
    verdict,
)


def test_a_saturated_generator_makes_the_run_invalid():
    calm = {"generator_cpu_percent": 40.0, "generator_saturated": False}
    busy = {"generator_cpu_percent": 97.0, "generator_saturated": True}
    assert validity(calm, calm) == {"valid": True, "invalid_reason": None}
    verdict = validity(calm, busy)
    assert verdict["valid"] is False and "phase 1" in verdict["invalid_reason"]


def test_the_generator_reports_its_own_cpu():
    generator = GeneratorCpu()
    generator.start()
    spend_cpu(0.05)
    report = generator.report()
    assert report["generator_cpu_percent"] > 0.0
    assert report["generator_saturated"] == (report["generator_cpu_percent"] >= 90.0)


def spend_cpu(seconds: float) -> None:
    """Work until the kernel has charged this process ``seconds`` more CPU.

    A fixed amount of work can finish inside one 10 ms accounting tick on a
    fast machine, and then the process reads as 0 % busy.
    """
    process = psutil.Process()
    start = sum(process.cpu_times()[:2])
    while sum(process.cpu_times()[:2]) - start < seconds:
        sum(i * i for i in range(10_000))


def generator(busy_percent: float, core: int | None = 1) -> ProcessCpu:
    """A generator process that was ``busy_percent`` busy over a 10 s window."""
    cores = None if core is None else (core,)
    return ProcessCpu(pid=1, cores=cores, sessions=10, cpu_s=busy_percent / 10, window_s=10.0)


def test_a_generator_process_above_80_percent_makes_the_run_invalid():
    assert generator(79.0).busy_percent == 79.0
    assert busy_reasons("bare echo", [generator(79.0, core=1), generator(30.0, core=2)]) == []
    reasons = busy_reasons("bare echo", [generator(30.0, core=1), generator(81.0, core=2)])
    assert len(reasons) == 1 and "bare echo" in reasons[0] and "process 1" in reasons[0]
    assert verdict([]) == {"valid": True, "invalid_reason": None, "invalid_reasons": []}
    assert verdict(reasons) == {
        "valid": False,
        "invalid_reason": reasons[0],
        "invalid_reasons": reasons,
    }


def test_generators_sharing_a_core_are_judged_together():
    """Two processes each under the limit on one core are over it between them."""
    (reason,) = busy_reasons("ours", [generator(45.0, core=1), generator(45.0, core=1)])
    assert "core 1" in reason
    assert busy_reasons("ours", [generator(45.0, core=None), generator(45.0, core=None)]) == []


def test_a_generator_process_reports_its_cpu():
    report = generator(25.0).report()
    assert report["cores"] == [1] and report["sessions"] == 10
    assert report["cpu_ms"] == 2500.0 and report["busy_percent"] == 25.0
