"""``duplex-server bench abuse``: what each attack of the security review
costs the well-behaved sessions beside it.

One server (default limits) serves ``--sessions`` echo sessions that stream
audio, commit and heartbeat as in ``bench sessions``. They are measured in
a quiet window, then in one window per attack while the attack runs from
another process (its own loopback address, so the per-address caps it
meets are its own). Per attack the JSON gives the bystanders' p99
heartbeat round trip and commit→first-audio against the quiet window, the
server's peak RSS against the quiet peak, the attack's own report (did the
bound hold) and every process's CPU. Targets: p99 within 2x of quiet (and
the heartbeat's under 100 ms), peak RSS within 200 MB of quiet, the bound
held. The run is invalid when the
bystanders' process saturated its core (its latencies are then its own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import time
from multiprocessing.connection import Connection

import psutil
import websockets

from duplex_bench import attacks
from duplex_bench.generator import GeneratorCpu, validity
from duplex_bench.server_process import HOST, ServerProcess
from duplex_bench.sessions import BenchClient, Measures, append_frame, quantiles, ratio

TARGET_P99_RATIO = 2.0
TARGET_HEARTBEAT_P99_MS = 100.0
TARGET_RSS_GROWTH_MIB = 200.0
RSS_SAMPLE_S = 0.05
SETTLE_S = 1.0  # between windows: bystanders renew, the previous attack's sockets drain


def _attacker(name: str, target: attacks.Target, control: Connection) -> None:
    """In the attack's own process: attack until told to stop, send back the report."""

    async def attack() -> dict:
        stop = asyncio.Event()
        task = asyncio.create_task(attacks.ATTACKS[name](target, stop))
        control.send("started")
        await asyncio.to_thread(control.recv)
        stop.set()
        return (await task).as_json()

    try:
        control.send(asyncio.run(attack()))
    except (OSError, TimeoutError, websockets.WebSocketException, KeyError) as exc:
        # The attack itself broke (a server that stopped answering, say): that
        # is the finding, so it goes into the bench's JSON, not a traceback.
        control.send({"bound_held": False, "attack_failed": repr(exc)})


class PeakRss:
    """The server's resident memory, sampled while a window runs."""

    def __init__(self, process: psutil.Process) -> None:
        self._process = process
        self.peak = 0

    async def sample(self, until: float) -> None:
        self.peak = 0
        while time.monotonic() < until:
            self.peak = max(self.peak, self._process.memory_info().rss)
            await asyncio.sleep(RSS_SAMPLE_S)

    @property
    def peak_mib(self) -> float:
        return round(self.peak / 2**20, 1)


async def _window(
    clients: list[BenchClient],
    server: psutil.Process,
    seconds: float,
    attacker: psutil.Process | None = None,
) -> dict:
    """Measure the bystanders for ``seconds`` (an attack, if any, already runs);
    what happens outside the window goes back to each client's own measures."""
    outside = [client.m for client in clients]
    measures = Measures()
    for client in clients:
        client.m = measures
    generator = GeneratorCpu()
    generator.start()
    server.cpu_percent(None)
    if attacker is not None:
        attacker.cpu_percent(None)
    rss = PeakRss(server)
    await rss.sample(time.monotonic() + seconds)
    for client, own in zip(clients, outside, strict=True):
        client.m = own
    return {
        "heartbeat_rtt_ms": quantiles(measures.heartbeat_rtt),
        "commit_to_first_audio_ms": quantiles(measures.commit_to_audio),
        "bystander_errors": measures.errors,
        "bystander_connect_failures": measures.connect_failures,
        "peak_rss_mib": rss.peak_mib,
        "server_cpu_percent": round(server.cpu_percent(None), 1),
        "attacker_cpu_percent": (
            None if attacker is None else round(attacker.cpu_percent(None), 1)
        ),
        **generator.report(),
    }


async def _attack_window(
    name: str,
    target: attacks.Target,
    clients: list[BenchClient],
    server: psutil.Process,
    seconds: float,
) -> dict:
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=_attacker, args=(name, target, theirs), daemon=True)
    process.start()
    try:
        await _answer(ours)  # "started"
        assert process.pid is not None
        measured = await _window(clients, server, seconds, psutil.Process(process.pid))
        ours.send("stop")
        report = await _answer(ours)
    finally:
        process.join(timeout=attacks.ANSWER_TIMEOUT_S * 2)
        if process.is_alive():
            process.kill()
    return {**measured, "attack": report}


async def _answer(control: Connection) -> object:
    """The attacker's next message; a process that died says so instead."""
    if await asyncio.to_thread(control.poll, attacks.ANSWER_TIMEOUT_S * 2):
        return control.recv()
    return {"bound_held": False, "attack_failed": "the attacker process did not answer"}


async def _renew(clients: list[BenchClient]) -> None:
    """Every bystander goes on in a fresh session, the renewals spread over
    ``SETTLE_S``; then the previous attack's sockets have drained too. Each
    window so starts from sessions of the same age: otherwise the logs the
    bystanders grow by talking would count as the later attacks' memory."""
    for client in clients:
        client.renew()
        await asyncio.sleep(SETTLE_S / len(clients))
    await asyncio.sleep(SETTLE_S)


def _judged(result: dict, quiet: dict) -> dict:
    heartbeat = ratio(result, quiet, "heartbeat_rtt_ms", "p99")
    audio = ratio(result, quiet, "commit_to_first_audio_ms", "p99")
    growth = round(result["peak_rss_mib"] - quiet["peak_rss_mib"], 1)
    result.update(
        heartbeat_p99_ratio_vs_quiet=heartbeat,
        commit_to_first_audio_p99_ratio_vs_quiet=audio,
        rss_growth_mib=growth,
        targets={
            "heartbeat_p99_within_2x": heartbeat is not None and heartbeat <= TARGET_P99_RATIO,
            "heartbeat_p99_under_100_ms": result["heartbeat_rtt_ms"]["p99"] is not None
            and result["heartbeat_rtt_ms"]["p99"] < TARGET_HEARTBEAT_P99_MS,
            "commit_to_first_audio_p99_within_2x": audio is not None and audio <= TARGET_P99_RATIO,
            "rss_within_200_mb": growth <= TARGET_RSS_GROWTH_MIB,
            "bound_held": result["attack"]["bound_held"],
        },
    )
    return result


async def _drive(server: ServerProcess, args: argparse.Namespace, names: list[str]) -> dict:
    frame = append_frame(args.chunk_ms)
    loop = asyncio.get_running_loop()
    windows = 1 + len(names)
    # The bystanders stream for every window; only the windows are measured.
    deadline = loop.time() + args.ramp_s + windows * (args.seconds + 2 * SETTLE_S + 3.0) + 30.0
    ramp = [Measures() for _ in range(args.sessions)]  # each client's own, outside the windows
    clients = [
        BenchClient(server.ws_url, frame, args, measures, deadline, measure_from=0.0)
        for measures in ramp
    ]
    tasks = [
        asyncio.create_task(c.run(args.ramp_s * i / max(1, args.sessions)))
        for i, c in enumerate(clients)
    ]
    await asyncio.sleep(args.ramp_s)
    watched = psutil.Process(server.pid)
    await _renew(clients)
    quiet = await _window(clients, watched, args.seconds)
    results = {}
    for index, name in enumerate(names):
        await _renew(clients)
        target = attacks.Target(HOST, server.port, source=f"127.0.1.{index + 1}")
        window = await _attack_window(name, target, clients, watched, args.seconds)
        results[name] = _judged(window, quiet)
    for client in clients:
        client.deadline = 0.0  # the senders stop at their next tick
    await asyncio.gather(*tasks)
    failures = sum(m.connect_failures for m in ramp) + sum(
        phase["bystander_connect_failures"] for phase in (quiet, *results.values())
    )
    return {"quiet": quiet, "attacks": results, "bystander_connect_failures": failures}


def run(args: argparse.Namespace) -> None:
    names = args.attacks.split(",") if args.attacks else list(attacks.ATTACKS)
    unknown = sorted(set(names) - set(attacks.ATTACKS))
    if unknown:
        known = ", ".join(attacks.ATTACKS)
        raise SystemExit(f"bench abuse: unknown attacks {unknown}; known: {known}")
    # The server's own per-address limits, not the benches' "no cap".
    server = ServerProcess(
        args.store,
        max_connections_per_ip=None,
        max_connection_rate_per_ip=None,
        max_sessions_per_ip=None,
    ).start()
    try:
        measured = asyncio.run(_drive(server, args, names))
    finally:
        server.stop()
    phases = [measured["quiet"], *measured["attacks"].values()]
    print(
        json.dumps(
            {
                "bench": "abuse",
                "sessions": args.sessions,
                "seconds_per_window": args.seconds,
                "store": args.store,
                "cpu_count": os.cpu_count(),
                **validity(*phases),
                **measured,
                "all_targets_met": all(
                    all(result["targets"].values()) for result in measured["attacks"].values()
                ),
            }
        )
    )
