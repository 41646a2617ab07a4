"""The fast step against the eager one on the tiny random Moshi, on any device:
``python scripts/moshi_fast_check.py --device cuda --dtype float32`` prints
one JSON object (frames compared per row, how many had equal tokens, the
largest sample difference). Two rows from the start, a third joins late,
one leaves and its row is reused; the main window is 6 so the ring wraps.
``--temperature T`` makes every stream sample (a seed of its own).

Also on the device: Mimi at static shapes (``mimi_graph``, CUDA graphs on
CUDA) against transformers' streaming codec frame by frame (codes equal,
largest sample difference), and a stream resumed on the fast step from
its whole log after the window wrapped against the uninterrupted eager
stream."""

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
from duplex_server.engine.duplex.mimi_graph import (  # noqa: E402
    GraphMimiDecoder,
    GraphMimiEncoder,
)
from duplex_server.engine.duplex.mimi_stream import (  # noqa: E402
    MimiStreamDecoder,
    MimiStreamEncoder,
)
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


def codec_check(model, signals) -> dict:
    """Both codecs over three rows, one restarting at tick 5."""
    mimi, k = model.audio_encoder, model.config.num_codebooks
    eager = MimiStreamEncoder(mimi, 3, k), MimiStreamDecoder(mimi, 3)
    static = GraphMimiEncoder(mimi, 3, k), GraphMimiDecoder(mimi, 3)
    generator = torch.Generator().manual_seed(9)
    equal, diff = 0, 0.0
    with torch.no_grad():
        for tick in range(TICKS):
            if tick == 5:
                for codec in (*eager, *static):
                    codec.reset(1)
            samples = torch.from_numpy(np.stack([signal[tick] for signal in signals]))
            samples = samples.to(model.device, model.dtype)
            codes = torch.randint(0, mimi.config.codebook_size, (3, k), generator=generator)
            codes = codes.to(model.device)
            equal += bool(torch.equal(eager[0].encode(samples), static[0].encode(samples)))
            voice = eager[1].decode(codes).float(), static[1].decode(codes).float()
            diff = max(diff, float((voice[0] - voice[1]).abs().max()))
    return {
        "frames": TICKS,
        "equal_codes": equal,
        "max_sample_diff": diff,
        "graphs": [codec._replay.graph is not None for codec in static],
    }


def resume_check(model, signals, temperature) -> dict:
    """Stream 0 run eagerly and uninterrupted; on the fast step, beside a busy
    row, rebuilt from its first 11 frames (past the window of 6) and run on."""
    logged = 11
    eager = DuplexStepper(model, rows=1)
    row = eager.join()
    eager.sample(row, Sampling(temperature, 1))
    expected = [eager.tick({row: signals[0][i]})[row] for i in range(TICKS)]
    fast = FastDuplexStepper(model, rows=2)
    other = fast.join()
    for index in range(3):
        fast.tick({other: signals[1][index]})
    resumed = fast.resume([(signals[0][i], expected[i].tokens) for i in range(logged)])
    fast.sample(resumed, Sampling(temperature, 1))
    got = []
    for index in range(logged, TICKS):
        out = fast.tick({other: signals[1][3 + index - logged], resumed: signals[0][index]})
        got.append(out[resumed])
    pairs = list(zip(expected[logged:], got, strict=True))
    return {
        "frames": len(pairs),
        "equal_tokens": sum(a.tokens == b.tokens for a, b in pairs),
        "max_sample_diff": float(max(np.abs(a.samples - b.samples).max() for a, b in pairs)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--temperature", type=float, default=0.0)
    # cuDNN convolutions run float32 in TF32 by default on CUDA: the resume's
    # one-shot codec prefill then rounds unlike the frame-by-frame stream
    parser.add_argument("--no-tf32", action="store_true", help="full float32 convs and matmuls")
    args = parser.parse_args()
    if args.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
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
    report["tf32"] = not args.no_tf32
    for row in eager:
        pairs = list(zip(eager[row], fast[row], strict=True))
        report[f"row{row}"] = {
            "frames": len(pairs),
            "equal_tokens": sum(a.tokens == b.tokens for a, b in pairs),
            "max_sample_diff": float(max(np.abs(a.samples - b.samples).max() for a, b in pairs)),
        }
    report["codec"] = codec_check(model, signals)
    report["resume_after_wrap"] = resume_check(model, signals, args.temperature)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
