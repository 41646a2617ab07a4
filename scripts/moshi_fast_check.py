"""The fast step against the eager one on the tiny random Moshi, on any device:
``python scripts/moshi_fast_check.py --device cuda --dtype float32`` prints
one JSON object (frames compared per row, how many had equal tokens, the
largest sample difference). Two rows from the start, a third joins late,
one leaves and its row is reused; the main window is 6 so the ring wraps.
``--temperature T`` makes every stream sample (a seed of its own)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from duplex_bench.tiny_moshi import FRAME_SAMPLES, tiny_moshi  # noqa: E402
from duplex_server.engine.duplex.fast_step import FastDuplexStepper  # noqa: E402
from duplex_server.engine.duplex.sampling import Sampling  # noqa: E402
from duplex_server.engine.duplex.stepper import DuplexStepper  # noqa: E402

TICKS = 16


def frames_of(model, cls, signals, temperature):
    stepper = cls(model, rows=3)
    seeds = iter(range(1, 5))

    def join():
        row = stepper.join()
        stepper.sample(row, Sampling(temperature, next(seeds)))
        return row

    out: dict[int, list] = {0: [], 1: [], 2: []}
    first, second = join(), join()
    late = None
    for tick in range(TICKS):
        inputs = {first: signals[0][tick], second: signals[1][tick]}
        if tick == 4:
            late = join()
        if late is not None:
            inputs[late] = signals[2][tick]
        if tick == 9:
            stepper.leave(second)
            del inputs[second]
            second = join()
            inputs[second] = signals[1][0]
        for row, frame in stepper.tick(inputs).items():
            out[row].append(frame)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = tiny_moshi(Path(tmp))
        model = transformers.MoshiForConditionalGeneration.from_pretrained(
            directory, dtype=getattr(torch, args.dtype), sliding_window=6
        )
    model = torch.nn.Module.to(model, args.device).eval()
    noise = np.random.default_rng(5)
    signals = [
        [(noise.standard_normal(FRAME_SAMPLES) * 0.3).astype(np.float32) for _ in range(TICKS)]
        for _ in range(3)
    ]
    eager = frames_of(model, DuplexStepper, signals, args.temperature)
    fast = frames_of(model, FastDuplexStepper, signals, args.temperature)
    report = {"device": args.device, "dtype": args.dtype, "temperature": args.temperature}
    for row in eager:
        pairs = list(zip(eager[row], fast[row], strict=True))
        report[f"row{row}"] = {
            "frames": len(pairs),
            "equal_tokens": sum(a.tokens == b.tokens for a, b in pairs),
            "max_sample_diff": float(max(np.abs(a.samples - b.samples).max() for a, b in pairs)),
        }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
