"""Where a tick's Mimi time goes at Moshi's real codec size (random
weights, bf16, on CUDA): the streaming encode and decode of ``--rows`` rows
timed separately (device-synchronised, p50 of 30 ticks after 5 warm-up
ticks), through transformers' streaming caches (``mimi_stream``) and at
static shapes captured as CUDA graphs (``mimi_graph``); one JSON object per
(rows, codec). ``--profile``: then one of each eager call under cProfile."""

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

from duplex_server.engine.duplex.mimi_graph import (  # noqa: E402
    GraphMimiDecoder,
    GraphMimiEncoder,
)
from duplex_server.engine.duplex.mimi_stream import (  # noqa: E402
    MimiStreamDecoder,
    MimiStreamEncoder,
)

WARMUP, TICKS = 5, 30


def timed(call, *args):
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = call(*args)
    torch.cuda.synchronize()
    return out, (time.perf_counter() - started) * 1000


def codecs(mimi: MimiModel, rows: int, kind: str):
    if kind == "graphed":
        return GraphMimiEncoder(mimi, rows, 8), GraphMimiDecoder(mimi, rows)
    return MimiStreamEncoder(mimi, rows, 8), MimiStreamDecoder(mimi, rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[16])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.backends.cuda.enable_cudnn_sdp(False)  # as make_stepper does
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        mimi = MimiModel(MimiConfig()).eval()
    torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        for rows in args.rows:
            samples = torch.randn(rows, 1920, device="cuda", dtype=torch.bfloat16) * 0.1
            for kind in ("eager", "graphed"):
                encoder, decoder = codecs(mimi, rows, kind)
                enc, dec = [], []
                for tick in range(WARMUP + TICKS):
                    codes, encode_ms = timed(encoder.encode, samples)
                    _, decode_ms = timed(decoder.decode, codes)
                    if tick >= WARMUP:
                        enc.append(encode_ms)
                        dec.append(decode_ms)
                figures = {
                    "rows": rows,
                    "codec": kind,
                    "encode_ms_p50": round(sorted(enc)[TICKS // 2], 2),
                    "decode_ms_p50": round(sorted(dec)[TICKS // 2], 2),
                    "encode_ms_max": round(max(enc), 2),
                    "decode_ms_max": round(max(dec), 2),
                }
                print(json.dumps(figures), flush=True)
                if args.profile and kind == "eager":
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
