"""``duplex-server bench llm-backend``: the transformers AR backend's decode
throughput against transformers' own batched ``generate`` in the same run.

Both decode the same prompts greedily for the same number of new tokens on
the same weights: a random-weight Llama of a named shape (``--shape 7b`` is
Llama-2-7B's: hidden 4096, 32 layers, 32 heads, ffn 11008) saved with
``save_pretrained`` and loaded by the backend the way ``--llm PATH`` loads it.
The tokenizer is a word-level one whose words are the token ids, so a prompt
of N words is N tokens, and the model has no end-of-sequence token: every
answer runs to ``--new-tokens``.

Ours: every session's request submitted at once through the engine core
(those that arrive together prefill in one padded forward, then they decode
in shared steps). Baseline: one
``generate`` call over the whole batch (prompts of one length, no padding).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from duplex_server.surface import ChatPayload, EngineCore, EngineRequest, TransformersBackend

SHAPES: dict[str, dict[str, Any]] = {
    # Llama-2-7B
    "7b": {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
    },
    # small enough for a CPU run of the same code
    "tiny": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 256,
        "vocab_size": 4096,
    },
}
_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"


def write_checkpoint(directory: Path, shape: str, dtype: str, device: str) -> None:
    """A random-weight Llama of ``shape`` and its word-level tokenizer (made
    on ``device`` in ``dtype``: a 7B model initialised on a CPU in float32
    would take minutes and 28 GB)."""
    dims = SHAPES[shape]
    vocab = {f"t{i}": i for i in range(dims["vocab_size"])}
    words = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0")
    tokenizer.chat_template = _TEMPLATE
    tokenizer.save_pretrained(directory)
    config = LlamaConfig(**dims, max_position_embeddings=4096, eos_token_id=None)
    torch.manual_seed(0)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default_dtype)
    model.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=0)
    model.save_pretrained(directory)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (count, length), generator=generator)
    return [row.tolist() for row in ids]


@dataclass
class Figures:
    seconds: float
    tokens: int
    ttft_ms: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


async def run_ours(core: EngineCore[ChatPayload, str], batch: list[list[int]], new: int) -> Figures:
    backend = core.backend
    assert isinstance(backend, TransformersBackend)
    before = sum(backend.step_sizes) + sum(backend.prefill_sizes)
    started = time.perf_counter()
    ttft: list[float] = []

    async def one(index: int, ids: list[int]) -> None:
        text = " ".join(f"t{i}" for i in ids)
        request = EngineRequest(
            request_id=f"r{index}-{started}",
            session_id=f"s{index}",
            response_id=f"resp{index}",
            epoch=0,
            payload=ChatPayload([{"role": "user", "content": text}], 0.0, new),
        )
        first = True
        async for _ in core.submit(request):
            if first:
                ttft.append((time.perf_counter() - started) * 1000)
                first = False

    await asyncio.gather(*(one(i, ids) for i, ids in enumerate(batch)))
    seconds = time.perf_counter() - started
    return Figures(seconds, sum(backend.step_sizes) + sum(backend.prefill_sizes) - before, ttft)


def run_generate(model: Any, batch: list[list[int]], new: int, device: str) -> Figures:
    # The template adds one space-separated word per token and nothing else,
    # so these ids are the prompt the backend sees.
    ids = torch.tensor(batch, device=device)
    _sync(device)
    started = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
    )
    _sync(device)
    seconds = time.perf_counter() - started
    return Figures(seconds, int(out.shape[0] * (out.shape[1] - ids.shape[1])), [])


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    backend = TransformersBackend(directory, dtype=args.dtype, device=args.device)
    if not backend.wait_loaded(timeout=1800):
        raise SystemExit(f"bench llm-backend: {backend.load_error}")
    core: EngineCore[ChatPayload, str] = EngineCore(backend, max_concurrency=256, name="bench")
    vocab = SHAPES[args.shape]["vocab_size"]
    rows = []
    for count in [int(n) for n in args.sessions.split(",")]:
        batch = prompts(count, args.prompt_tokens, vocab, seed=count)
        # A warm-up of each at this batch size, then the better of two runs.
        asyncio.run(run_ours(core, batch, 8))
        ours = max(
            (asyncio.run(run_ours(core, batch, args.new_tokens)) for _ in range(2)),
            key=lambda figures: figures.tokens_per_s,
        )
        run_generate(backend.model, batch, 8, args.device)
        baseline = max(
            (run_generate(backend.model, batch, args.new_tokens, args.device) for _ in range(2)),
            key=lambda figures: figures.tokens_per_s,
        )
        rows.append(
            {
                "sessions": count,
                "ours_tokens_per_s": round(ours.tokens_per_s, 1),
                "generate_tokens_per_s": round(baseline.tokens_per_s, 1),
                "ratio": round(ours.tokens_per_s / baseline.tokens_per_s, 3),
                "ours_tokens": ours.tokens,
                "generate_tokens": baseline.tokens,
                "ours_ttft_ms_p50": round(statistics.median(ours.ttft_ms), 1),
                "ours_ttft_ms_max": round(max(ours.ttft_ms), 1),
            }
        )
    backend.close()
    return {
        "bench": "llm-backend",
        "shape": args.shape,
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "dtype": args.dtype,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "results": rows,
    }


def run(args: argparse.Namespace) -> None:
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        write_checkpoint(directory, args.shape, args.dtype, args.device)
        print(json.dumps(measure(args, directory)))
