"""Where a tick's Mimi time goes at Moshi's real codec size: the streaming
encode and decode of ``--rows`` rows timed separately (device-synchronised),
then one of each under cProfile (the Python functions that dominate)."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch
from transformers import MimiConfig, MimiModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from duplex_server.engine.duplex.mimi_stream import (  # noqa: E402
    MimiStreamDecoder,
    MimiStreamEncoder,
)


def timed(call, *args):
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = call(*args)
    torch.cuda.synchronize()
    return out, (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--no-cudnn-sdp", action="store_true")
    args = parser.parse_args()
    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        mimi = MimiModel(MimiConfig()).eval()
    torch.set_default_dtype(torch.float32)
    encoder = MimiStreamEncoder(mimi, args.rows, 8)
    decoder = MimiStreamDecoder(mimi, args.rows)
    samples = torch.randn(args.rows, 1920, device="cuda", dtype=torch.bfloat16) * 0.1
    enc, dec = [], []
    with torch.no_grad():
        for _ in range(30):
            codes, ms = timed(encoder.encode, samples)
            enc.append(ms)
            _, ms = timed(decoder.decode, codes)
            dec.append(ms)
        print(
            json.dumps(
                {
                    "rows": args.rows,
                    "encode_ms_p50": sorted(enc)[15],
                    "decode_ms_p50": sorted(dec)[15],
                }
            ),
            flush=True,
        )
        for name, call, arg in (
            ("encode", encoder.encode, samples),
            ("decode", decoder.decode, codes),
        ):
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(5):
                call(arg)
            torch.cuda.synchronize()
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(14)
            print(name, out.getvalue()[-3500:], flush=True)


if __name__ == "__main__":
    main()
