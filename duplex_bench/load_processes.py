"""``bench sessions``' load generator: its clients spread over processes,
pinned away from the server's cores.

One event loop in the bench process saturates its core long before a
server that is faster than the client library does, and a generator that
shares a core with the server takes CPU from it: either way the latencies
would measure the generator. So the server gets the first cores
(``CorePlan``), and the clients are dealt round-robin to generator
processes, one loop each, pinned one to a core on the rest.

Every process starts (imports take a second or more on a busy machine) and
says it is ready; only then does the parent fix the start on the shared
monotonic clock (CLOCK_MONOTONIC is system-wide, and asyncio's
``loop.time()`` reads it). The ramp, the measured window and the deadline
are then the same instants in every generator and in the parent, which
measures the server over that window; each generator measures its own CPU
time over it and sends it back with its samples.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from duplex_bench.generator import ProcessCpu
from duplex_bench.load_client import BenchClient, Measures, append_frame

READY = "ready"
# Limits on a broken generator, not measurements: its start (imports) and,
# after the deadline, its clients' closing (a connect gives up after 10 s).
START_LIMIT_S = 120.0
RESULT_LIMIT_S = 120.0
START_MARGIN_S = 0.1  # from sending the schedule to its start, so all receive it first

Cores = tuple[int, ...]


class GeneratorError(RuntimeError):
    """A generator process died or never answered: the bench's fault, not the server's."""


@dataclass(frozen=True)
class CorePlan:
    """Which cores the server and the generators run on; ``None`` for both
    when nothing is pinned (one core, ``--server-cores 0``, or a platform
    without CPU affinity), and ``note`` says why."""

    server: Cores | None
    generators: Cores | None
    note: str

    def generator_core(self, index: int) -> Cores | None:
        """Generator ``index``'s one core, round-robin over the generator cores."""
        if self.generators is None:
            return None
        return (self.generators[index % len(self.generators)],)

    def report(self) -> dict:
        return {
            "pinned": self.server is not None,
            "server_cores": None if self.server is None else list(self.server),
            "generator_cores": None if self.generators is None else list(self.generators),
            "note": self.note,
        }


def usable_cores() -> Cores | None:
    """The cores this process may run on, or None where affinity is unknown."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_cores(server_cores: int | None, available: Cores | None) -> CorePlan:
    """The server on the first ``server_cores`` of ``available``, the
    generators on the rest. ``None`` asks for the default: one core for the
    server where there are at least two."""
    if available is None:
        return CorePlan(None, None, "not pinned: this platform has no CPU affinity")
    if server_cores is None:
        server_cores = 1 if len(available) >= 2 else 0
    if server_cores == 0:
        reason = "one core" if len(available) < 2 else "--server-cores 0"
        return CorePlan(None, None, f"not pinned ({reason}): server and generators share cores")
    if not 0 < server_cores < len(available):
        raise ValueError(
            f"--server-cores {server_cores} leaves no core for the generators "
            f"(this process may use {len(available)})"
        )
    server, generators = available[:server_cores], available[server_cores:]
    return CorePlan(server, generators, f"server on {len(server)}, generators on {len(generators)}")


def default_generators(plan: CorePlan, available: Cores | None) -> int:
    """One generator per core not given to the server, at least one."""
    if plan.generators is not None:
        return len(plan.generators)
    return max(1, (len(available) if available else 1) - 1)


@contextmanager
def pinned(cores: Cores | None) -> Iterator[None]:
    """This thread on ``cores`` for the block: a process started inside it
    inherits them (a thread's CPU mask passes through fork and exec), so
    every thread the server later starts runs on them too."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@dataclass(frozen=True)
class Share:
    """One generator process's clients, by their index in the whole load
    (which picks their server and their place in the ramp)."""

    urls: tuple[str, ...]
    indices: tuple[int, ...]
    sessions: int  # in the whole load
    chunk_ms: int
    commit_every_s: float
    cores: Cores | None


@dataclass(frozen=True)
class Schedule:
    """Instants on the shared monotonic clock."""

    start: float
    ramp_s: float
    measure_from: float
    deadline: float


@dataclass
class Outcome:
    """What a generator process sends back."""

    measures: Measures
    cpu: ProcessCpu


def deal(
    urls: Sequence[str],
    sessions: int,
    generators: int,
    plan: CorePlan,
    chunk_ms: int,
    commit_every_s: float,
) -> list[Share]:
    """Sessions round-robin over the generators (and over ``urls`` by index);
    no more generators than sessions."""
    generators = max(1, min(generators, sessions))
    return [
        Share(
            tuple(urls),
            tuple(range(g, sessions, generators)),
            sessions,
            chunk_ms,
            commit_every_s,
            plan.generator_core(g),
        )
        for g in range(generators)
    ]


def _generator(conn: Connection, share: Share) -> None:
    """A generator process: pin, say ready, wait for the schedule, run the clients."""
    if share.cores is not None:
        os.sched_setaffinity(0, share.cores)
    conn.send(READY)
    schedule: Schedule = conn.recv()
    conn.send(asyncio.run(_clients(share, schedule)))
    conn.close()


async def _clients(share: Share, schedule: Schedule) -> Outcome:
    loop = asyncio.get_running_loop()
    frame = append_frame(share.chunk_ms)
    pacing = argparse.Namespace(chunk_ms=share.chunk_ms, commit_every_s=share.commit_every_s)
    measures = Measures()
    tasks = []
    for index in share.indices:
        client = BenchClient(
            share.urls[index % len(share.urls)],
            frame,
            pacing,
            measures,
            schedule.deadline,
            schedule.measure_from,
        )
        starts_at = schedule.start + schedule.ramp_s * index / share.sessions
        tasks.append(asyncio.create_task(client.run(max(0.0, starts_at - loop.time()))))
    await asyncio.sleep(max(0.0, schedule.measure_from - loop.time()))
    cpu_before, wall_before = time.process_time(), time.monotonic()
    await asyncio.sleep(max(0.0, schedule.deadline - loop.time()))
    cpu_after, wall_after = time.process_time(), time.monotonic()
    await asyncio.gather(*tasks)
    cpu = ProcessCpu(
        os.getpid(),
        share.cores,
        len(share.indices),
        cpu_after - cpu_before,
        wall_after - wall_before,
    )
    return Outcome(measures, cpu)


class GeneratorPool:
    """The generator processes of one phase, started on entry, reaped on exit."""

    def __init__(self, shares: Sequence[Share], target: Callable[..., None] | None = None) -> None:
        """``target(connection, share)`` is what each process runs: the
        sessions' generator, unless a bench has clients of its own."""
        self._shares = shares
        self._target = target or _generator
        self._context = multiprocessing.get_context("spawn")
        self._running: list[tuple[BaseProcess, Connection]] = []

    def __enter__(self) -> GeneratorPool:
        for share in self._shares:
            ours, theirs = self._context.Pipe()
            process = self._context.Process(target=self._target, args=(theirs, share), daemon=True)
            with pinned(share.cores):  # so its imports run on its core too
                process.start()
            theirs.close()
            self._running.append((process, ours))
        try:
            for index, _ in enumerate(self._running):
                if self._receive(index, START_LIMIT_S) != READY:
                    raise GeneratorError(f"generator process {index} did not say it was ready")
        except GeneratorError:
            self._reap()
            raise
        return self

    def start(self, ramp_s: float, seconds: float) -> Schedule:
        """Start every client on one schedule; the window opens a second after the ramp."""
        start = time.monotonic() + START_MARGIN_S
        measure_from = start + ramp_s + 1.0
        schedule = Schedule(start, ramp_s, measure_from, measure_from + seconds)
        for _, conn in self._running:
            conn.send(schedule)
        return schedule

    def outcomes(self) -> list[Outcome]:
        """Each process's measures and CPU, once its clients have closed."""
        return [self._receive(index, RESULT_LIMIT_S) for index, _ in enumerate(self._running)]

    def _receive(self, index: int, limit_s: float):
        process, conn = self._running[index]
        try:
            if conn.poll(limit_s):
                return conn.recv()
        except EOFError:
            pass
        process.join(timeout=1.0)
        raise GeneratorError(
            f"generator process {index} (pid {process.pid}) sent nothing within {limit_s:g} s; "
            f"exit status {process.exitcode} (its traceback, if any, is on stderr)"
        )

    def __exit__(self, *exc_info: object) -> None:
        self._reap()

    def _reap(self) -> None:
        for process, conn in self._running:
            conn.close()
            process.join(timeout=5.0)
            if process.is_alive():
                process.kill()
                process.join()
        self._running.clear()
