"""Tick time of the batched step, run directly (no server).

``python -m duplex_server.engine.duplex.bench_step PATH --rows 1 4 16
--frames 50 [--step eager fast] [--codec graphed eager] [--context 3000]
[--segment N]`` prints one JSON object per (step, codec, temperature,
batch size): p50 / p99 / max tick ms, Mimi's encode + decode ms a tick
(p50 / p99) and its share of the p50 tick, frames a second, and ticks over
the 80 ms budget; with ``--segment N`` the same p50 / p99 / max for each
run of N ticks (a long call: is the tick flat after the window fills?).
``--codec`` picks the fast step's Mimi: static shapes in CUDA graphs
(``mimi_graph``, the default) or transformers' streaming caches.
``--rebuild-frames F`` times instead ``DuplexStepper.rebuild`` of one row
from F logged frames (a resume's prefill), once per F. ``PATH`` ``random-7b``
builds a random-weight model at Moshi's real shape (MoshiConfig's defaults:
a 7B temporal transformer, the 6-layer depth decoder, full-size Mimi)
directly on ``--device`` in ``--dtype``, so no 15 GB checkpoint is written.

``--context C`` starts every row with C positions already in its KV cache
(random keys and values: the attention reads exactly as much as after C
real frames, which is what the tick time depends on), instead of running
C ticks first.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers import MoshiConfig, MoshiForConditionalGeneration

from duplex_server.engine.duplex.checkpoint import DTYPES, check_moshi_checkpoint
from duplex_server.engine.duplex.fast_step import FastDuplexStepper, make_stepper
from duplex_server.engine.duplex.sampling import Sampling
from duplex_server.engine.duplex.service import FRAME_SAMPLES, load_moshi
from duplex_server.engine.duplex.stepper import DuplexStepper
from duplex_server.engine.duplex.tokens import FrameTokens

BUDGET_MS = 80.0
SESSION_TEMPERATURE = 0.8  # a session's default (OpenAI's): its rows sample
WARMUP_TICKS = 4  # the fast step's graphs are captured at its third tick
RANDOM_7B = "random-7b"
STEPS = ("eager", "fast")
CODECS = ("graphed", "eager")  # the fast step's Mimi (the eager step's is always eager)


def measure(
    stepper: DuplexStepper,
    frames: int,
    context: int = 0,
    seed: int = 0,
    temperature: float = SESSION_TEMPERATURE,
    segment: int = 0,
) -> dict[str, Any]:
    """Join every row, give them ``context`` positions, and time ``frames``
    ticks; every row samples at ``temperature`` (0: greedy), as a session
    does by default, each with a seed of its own; ``segment``: the tick
    quantiles of every run of that many ticks too."""
    rows = [stepper.join() for _ in range(stepper.rows)]
    for row in rows:
        stepper.sample(row, Sampling(temperature, seed=seed * stepper.rows + row))
    if context:
        fill_context(stepper, context)
    noise = np.random.default_rng(seed)
    mimi_ms = _time_mimi(stepper)
    ticks: list[float] = []
    codec: list[float] = []
    for index in range(WARMUP_TICKS + frames):
        inputs = {
            row: (noise.standard_normal(FRAME_SAMPLES) * 0.1).astype(np.float32) for row in rows
        }
        mimi_ms.clear()
        started = time.perf_counter()
        stepper.tick(inputs)  # ends reading the voice back to the host: synchronised
        if index >= WARMUP_TICKS:
            ticks.append((time.perf_counter() - started) * 1000)
            codec.append(sum(mimi_ms))
    spent, mimi = np.array(ticks), np.array(codec)
    figures = _quantiles(spent)
    figures["mimi_ms_p50"] = round(float(np.percentile(mimi, 50)), 2)
    figures["mimi_ms_p99"] = round(float(np.percentile(mimi, 99)), 2)
    figures["mimi_share_p50"] = round(figures["mimi_ms_p50"] / figures["tick_ms_p50"], 3)
    if segment:
        figures["segments"] = [
            {
                "from_frame": context + WARMUP_TICKS + start,
                **_quantiles(spent[start : start + segment]),
            }
            for start in range(0, len(spent), segment)
        ]
    return {
        "rows": len(rows),
        "frames": frames,
        "context": context,
        "temperature": temperature,
        **figures,
        "frames_per_s": round(len(rows) * 1000 / float(spent.mean()), 1),
        "over_budget_ticks": int((spent > BUDGET_MS).sum()),
    }


def _quantiles(spent: np.ndarray) -> dict[str, Any]:
    return {
        "tick_ms_p50": round(float(np.percentile(spent, 50)), 2),
        "tick_ms_p99": round(float(np.percentile(spent, 99)), 2),
        "tick_ms_max": round(float(spent.max()), 2),
    }


def time_rebuild(model: MoshiForConditionalGeneration, frames: int, seed: int = 0) -> dict:
    """Seconds ``DuplexStepper.rebuild`` takes over ``frames`` logged frames
    of noise and random tokens (what a resume after ``frames`` frames does
    off the tick thread), and the device memory it peaked at."""
    config: Any = model.config
    noise = np.random.default_rng(seed)
    audio_vocab = int(config.audio_vocab_size or model.audio_encoder.config.codebook_size)
    history = [
        (
            (noise.standard_normal(FRAME_SAMPLES) * 0.1).astype(np.float32),
            FrameTokens(
                int(noise.integers(config.vocab_size)),
                tuple(int(c) for c in noise.integers(audio_vocab, size=config.num_codebooks)),
            ),
        )
        for _ in range(frames)
    ]
    device = model.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    started = time.perf_counter()
    rebuilt = DuplexStepper.rebuild(model, history)
    _sync(device)
    seconds = time.perf_counter() - started
    figures: dict[str, Any] = {
        "rebuild_frames": frames,
        "rebuild_s": round(seconds, 3),
        "cached_positions": max(
            (layer.keys.shape[-2] for layer in rebuilt.cache.layers),  # type: ignore[union-attr]
            default=0,
        ),
    }
    if device.type == "cuda":
        figures["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return figures


def fill_context(stepper: DuplexStepper, context: int) -> None:
    """Every row as if ``context`` frames had run: random keys and values in its cache."""
    if isinstance(stepper, FastDuplexStepper):
        stepper.keys.normal_()
        stepper.values.normal_()
        stepper.valid[:, : min(context, stepper.window)] = True
        stepper.positions.fill_(context)
        stepper.slot.fill_(context % stepper.window)
    else:
        config: Any = stepper.model.config
        shape = (stepper.rows, config.num_key_value_heads, context, config.head_dim)
        device, dtype = stepper.model.device, stepper.model.dtype
        for layer in range(config.num_hidden_layers):
            keys = torch.randn(*shape, device=device, dtype=dtype)
            values = torch.randn(*shape, device=device, dtype=dtype)
            stepper.cache.update(keys, values, layer)
        stepper.timeline.start.zero_()
    stepper.timeline.length = context


def _time_mimi(stepper: DuplexStepper) -> list[float]:
    """Wrap the stepper's codec calls to record their time (device-synchronised)."""
    spent: list[float] = []
    device = stepper.model.device

    def timed(
        call: Callable[[torch.Tensor], torch.Tensor],
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(tensor: torch.Tensor) -> torch.Tensor:
            _sync(device)
            started = time.perf_counter()
            out = call(tensor)
            _sync(device)
            spent.append((time.perf_counter() - started) * 1000)
            return out

        return run

    stepper.encoder.encode = timed(stepper.encoder.encode)  # type: ignore[method-assign,assignment]
    stepper.decoder.decode = timed(stepper.decoder.decode)  # type: ignore[method-assign,assignment]
    return spent


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_7b(device: str, dtype: str) -> MoshiForConditionalGeneration:
    """Moshi's real shape with random weights, built on ``device`` (nothing saved)."""
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype, torch.float32)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device(device):
            model = MoshiForConditionalGeneration(MoshiConfig(audio_vocab_size=2048))
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", help=f"a Moshi-architecture checkpoint directory, or {RANDOM_7B}")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--context", type=int, default=0, help="KV positions each row starts with")
    parser.add_argument("--step", nargs="+", choices=STEPS, default=["eager"])
    parser.add_argument("--codec", nargs="+", choices=CODECS, default=["graphed"])
    parser.add_argument("--segment", type=int, default=0, help="quantiles per run of N ticks")
    parser.add_argument(
        "--rebuild-frames",
        type=int,
        nargs="+",
        default=[],
        help="time a one-row rebuild from this many logged frames instead of ticks",
    )
    parser.add_argument(
        "--stop-over-ms",
        type=float,
        default=0.0,
        help="skip larger batches of a step once its p99 tick exceeds this (0: never)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    parser.add_argument(
        "--temperature",
        type=float,
        nargs="+",
        default=[SESSION_TEMPERATURE],
        help="each row's sampling temperature (0: greedy); several: measured in turn",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.path == RANDOM_7B:
        model = random_7b(args.device, args.dtype)
    else:
        model = load_moshi(check_moshi_checkpoint(args.path), args.device, args.dtype)
    for frames in args.rebuild_frames:
        print(json.dumps({"device": args.device, "dtype": args.dtype, **_rebuild(model, frames)}))
    if args.rebuild_frames:
        return
    runs = [(step, codec) for step in args.step for codec in args.codec if step == "fast"]
    runs += [("eager", "eager")] if "eager" in args.step else []
    for (step, codec), temperature in itertools.product(runs, args.temperature):
        for rows in args.rows:
            figures = _one(
                model, step, codec, rows, args.frames, args.context, temperature, args.segment
            )
            labels = {"device": args.device, "dtype": args.dtype, "step": step, "codec": codec}
            print(json.dumps({**labels, **figures}), flush=True)
            if args.stop_over_ms and figures.get("tick_ms_p99", 0) > args.stop_over_ms:
                break


def _one(
    model: MoshiForConditionalGeneration,
    step: str,
    codec: str,
    rows: int,
    frames: int,
    context: int,
    temperature: float,
    segment: int,
) -> dict[str, Any]:
    """One measurement; running out of device memory is a figure, not a crash."""
    try:
        # one stepper only: a second built beside the first held two KV rings
        # (the eager-codec run at 32 rows, context 3,000, did not fit an H100)
        stepper = make_stepper(model, rows, step, graphed_codec=codec != "eager")
        return measure(stepper, frames, context, temperature=temperature, segment=segment)
    except torch.OutOfMemoryError as exc:
        return {"rows": rows, "context": context, "error": f"out of memory: {str(exc)[:120]}"}
    finally:
        gc.collect()
        if model.device.type == "cuda":
            torch.cuda.empty_cache()


def _rebuild(model: MoshiForConditionalGeneration, frames: int) -> dict[str, Any]:
    try:
        return time_rebuild(model, frames)
    except torch.OutOfMemoryError as exc:
        return {"rebuild_frames": frames, "error": f"out of memory: {str(exc)[:120]}"}
    finally:
        gc.collect()
        if model.device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
