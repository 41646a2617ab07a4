"""``duplex-server bench chaos``: faults at random moments under streaming load,
and proof that nothing acknowledged was lost.

While ``--clients`` sessions stream audio, commit and acknowledge playback,
a driver injects ``--faults`` faults in a seeded random order, each held for
a bounded time: ``kill -9`` of the server, a full disk and a revoked
database (SQLite), ``kill -9`` of one of two replicas and a Redis restart
(Redis), and dropped client sockets (both). Clients resume after each one.
At the end every client closes its session, the servers stop, and each
session's log is read from the store and audited against what its client
was acknowledged and saw (``chaos_audit``). The run prints one JSON line:
faults injected, resumes, time to resume, and every count that must be zero.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from duplex_bench.chaos_audit import Findings, audit
from duplex_bench.chaos_client import ChaosClient
from duplex_bench.chaos_faults import Deployment, ReplicaDeployment, SqliteDeployment
from duplex_bench.generator import GeneratorCpu, validity
from duplex_bench.progress import bar
from duplex_bench.sessions import quantiles

DEPLOYMENTS: dict[str, Callable[[Path, random.Random], Deployment]] = {
    "sqlite": SqliteDeployment,
    "replicas": ReplicaDeployment,
}
CLOSE_TIMEOUT_S = 30.0  # for every client to close its session once the faults are over
SAMPLE_RATE_HZ = 24_000


def fault_plan(kinds: tuple[str, ...], count: int, rng: random.Random) -> list[str]:
    """``count`` faults: every kind once per round, each round shuffled, so a
    short run still meets each kind."""
    plan: list[str] = []
    while len(plan) < count:
        round_ = list(kinds)
        rng.shuffle(round_)
        plan += round_
    return plan[:count]


def tone(chunk_ms: int) -> bytes:
    samples = np.arange(SAMPLE_RATE_HZ * chunk_ms // 1000) / SAMPLE_RATE_HZ
    return (np.sin(samples * 2 * np.pi * 330) * 6000).astype("<i2").tobytes()


async def _inject(
    deployment: Deployment,
    clients: list[ChaosClient],
    kind: str,
    hold_s: float,
    rng: random.Random,
) -> None:
    if kind == "socket_drop":
        for client in rng.sample(clients, max(1, len(clients) // 3)):
            client.drop()
        return
    await deployment.inject(kind, hold_s)


async def _drive(deployment: Deployment, args: argparse.Namespace, rng: random.Random) -> dict:
    zero = time.monotonic()
    pcm = tone(args.chunk_ms)
    urls = deployment.urls()
    clients = [
        ChaosClient(
            f"c{i}",
            urls[i % len(urls) :] + urls[: i % len(urls)],  # spread over the replicas
            pcm,
            chunk_ms=args.chunk_ms,
            commit_every=args.commit_every,
            heartbeat_every=args.heartbeat_every,
            clock_zero=zero,
        )
        for i in range(args.clients)
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(client.run(stop)) for client in clients]
    cpu = GeneratorCpu()
    cpu.start()
    faults = []
    with bar(args, f"chaos {deployment.name}", args.faults, "fault") as shown:
        shown.set_postfix_str("warming up")
        await asyncio.sleep(args.warmup_s)
        for kind in fault_plan((*deployment.kinds, "socket_drop"), args.faults, rng):
            await asyncio.sleep(rng.uniform(args.min_gap_s, args.max_gap_s))
            hold_s = rng.uniform(args.min_hold_s, args.max_hold_s)
            began = time.monotonic() - zero
            shown.set_postfix_str(kind)
            await _inject(deployment, clients, kind, hold_s, rng)
            faults.append(
                {
                    "kind": kind,
                    "t_s": round(began, 2),
                    "healed_s": round(time.monotonic() - zero, 2),
                }
            )
            shown.update()
        shown.set_postfix_str("settling")
        await asyncio.sleep(args.settle_s)
    stop.set()
    _, stuck = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
    for task in stuck:
        task.cancel()
    for client in clients:
        if not client.w.closed and client.w.failure is None:
            client.w.failure = "did not close its session"
    return {
        "faults": faults,
        "clients": clients,
        "cpu": cpu.report(),
        "seconds": time.monotonic() - zero,
    }


async def _audit(deployment: Deployment, clients: list[ChaosClient], dump: str) -> Findings:
    total = Findings()
    for client in clients:
        if client.w.session_id is None:
            continue
        records = await deployment.records(client.w.session_id)
        found = audit(client.w, records)
        total.merge(found)
        if dump and (client.w.failure or not found.clean):
            _dump(Path(dump) / f"{deployment.name}-{client.w.name}.json", client, records, found)
    return total


def _dump(path: Path, client: ChaosClient, records: list, found: Findings) -> None:
    """What a failed client knew and what its log holds, for the post-mortem."""
    w = client.w
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "client": w.name,
                "session_id": w.session_id,
                "failure": w.failure,
                "findings": vars(found),
                "resumes": w.resumes,
                "acknowledged": [
                    [op.event_id, op.kind, op.acknowledged_by] for op in w.acknowledged
                ],
                "refused": w.refused,
                "log": [
                    [r.seq, r.ts_ms, r.kind, r.origin, r.event_id, _brief(r.body)] for r in records
                ],
            }
        )
    )


def _brief(body: object) -> str:
    for name in ("event_type", "action", "signal", "what", "reason"):
        value = getattr(body, name, None)
        if value:
            owner = getattr(body, "owner", "")
            fence = getattr(body, "fence", "")
            return f"{value} {owner} {fence}".strip()
    return ""


def run_deployment(name: str, args: argparse.Namespace) -> dict:
    rng = random.Random(f"{args.seed}-{name}")
    with tempfile.TemporaryDirectory(prefix=f"duplex-chaos-{name}-") as tmp:
        deployment = DEPLOYMENTS[name](Path(tmp), rng)
        try:
            asyncio.run(deployment.start())
            drive = asyncio.run(_drive(deployment, args, rng))
            deployment.stop()  # the log is read with no server writing to it
            findings = asyncio.run(_audit(deployment, drive["clients"], args.dump))
        finally:
            deployment.stop()
            deployment.close()
    return _report(name, deployment, drive, findings, args)


def _report(name: str, deployment: Deployment, drive: dict, findings: Findings, args) -> dict:
    clients: list[ChaosClient] = drive["clients"]
    resumes = [seconds for c in clients for _, seconds in c.w.resumes]
    injected: dict[str, int] = {}
    for fault in drive["faults"]:
        injected[fault["kind"]] = injected.get(fault["kind"], 0) + 1
    failures = {c.w.name: c.w.failure for c in clients if c.w.failure}
    return {
        "deployment": name,
        "faults_injected": injected,
        "faults_skipped": deployment.skipped,
        "faults": drive["faults"],
        "duration_s": round(drive["seconds"], 1),
        "drops_seen": sum(c.w.drops for c in clients),
        "resumes": len(resumes),
        "time_to_resume_ms": quantiles(resumes),
        "acknowledged": findings.acknowledged,
        "refused_during_outages": sum(len(c.w.refused) for c in clients),
        "findings": vars(findings),
        "records_lost": findings.records_lost,
        "sessions_failed": failures,
        **drive["cpu"],
        "passed": findings.clean and not failures,
        "timeline": {
            "resumes": [[round(at, 2), round(s, 3)] for c in clients for at, s in c.w.resumes],
            "acks_at": sorted(round(t, 2) for c in clients for t in c.w.acks_at),
        },
    }


def plot(reports: list[dict], path: str) -> None:
    """Per deployment: the faults as spans, each resume's time to resume, and
    acknowledged input events per second."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    figure, rows = plt.subplots(3, len(reports), figsize=(7 * len(reports), 8), squeeze=False)
    for column, report in enumerate(reports):
        spans, resumes, rate = rows[0][column], rows[1][column], rows[2][column]
        kinds = sorted({f["kind"] for f in report["faults"]})
        for fault in report["faults"]:
            y = kinds.index(fault["kind"])
            width = max(0.1, fault["healed_s"] - fault["t_s"])
            spans.broken_barh([(fault["t_s"], width)], (y - 0.4, 0.8), color=f"C{y}")
        spans.set_yticks(range(len(kinds)), kinds)
        spans.set_title(f"{report['deployment']}: records lost {report['records_lost']}")
        timeline = report["timeline"]
        if timeline["resumes"]:
            at, seconds = zip(*timeline["resumes"], strict=True)
            resumes.scatter(at, [s * 1000 for s in seconds], s=8)
        resumes.set_ylabel("time to resume (ms)")
        acks = timeline["acks_at"]
        if acks:
            rate.hist(acks, bins=np.arange(0.0, acks[-1] + 1.0))  # one bar a second
        rate.set_ylabel("acknowledged inputs / s")
        rate.set_xlabel("seconds")
        for axis in (resumes, rate):
            axis.sharex(spans)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run(args: argparse.Namespace) -> None:
    names = list(DEPLOYMENTS) if args.deployment == "both" else [args.deployment]
    reports = [run_deployment(name, args) for name in names]
    if args.plot:
        plot(reports, args.plot)
    result = {
        "bench": "chaos",
        "seed": args.seed,
        "clients": args.clients,
        "cpu_count": os.cpu_count(),
        **validity(*reports),
        "records_lost": sum(r["records_lost"] for r in reports),
        "passed": all(r["passed"] for r in reports),
        "plot": args.plot,
        "deployments": reports,
    }
    print(json.dumps(result))
