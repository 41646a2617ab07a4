"""Tick time of the batched step, run directly (no server): ``python -m
duplex_server.engine.duplex.bench_step PATH --rows 1 4 16 --frames 50``
prints one JSON object per batch size (p50 / p99 / max tick ms, frames a
second, and ticks over the 80 ms budget)."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from duplex_server.engine.duplex.checkpoint import DTYPES, check_moshi_checkpoint
from duplex_server.engine.duplex.service import FRAME_SAMPLES, load_moshi
from duplex_server.engine.duplex.stepper import DuplexStepper

BUDGET_MS = 80.0
WARMUP_TICKS = 3


def measure(stepper: DuplexStepper, frames: int, seed: int = 0) -> dict[str, float]:
    rows = [stepper.join() for _ in range(stepper.rows)]
    noise = np.random.default_rng(seed)
    ticks: list[float] = []
    for index in range(WARMUP_TICKS + frames):
        inputs = {
            row: (noise.standard_normal(FRAME_SAMPLES) * 0.1).astype(np.float32) for row in rows
        }
        started = time.perf_counter()
        stepper.tick(inputs)
        if index >= WARMUP_TICKS:
            ticks.append((time.perf_counter() - started) * 1000)
    spent = np.array(ticks)
    return {
        "rows": len(rows),
        "frames": frames,
        "tick_ms_p50": round(float(np.percentile(spent, 50)), 2),
        "tick_ms_p99": round(float(np.percentile(spent, 99)), 2),
        "tick_ms_max": round(float(spent.max()), 2),
        "frames_per_s": round(len(rows) * 1000 / float(spent.mean()), 1),
        "over_budget_ticks": int((spent > BUDGET_MS).sum()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", help="a Moshi-architecture checkpoint directory")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_moshi(check_moshi_checkpoint(args.path), args.device, args.dtype)
    for rows in args.rows:
        figures = measure(DuplexStepper(model, rows), args.frames)
        print(json.dumps({"device": args.device, "dtype": args.dtype, **figures}), flush=True)


if __name__ == "__main__":
    main()
