"""A vLLM logits processor that makes each decode step of the remote-LLM
tests' server take a few milliseconds longer: the tiny model decodes a
token a millisecond, so its 400-token answers would end in half a second
and a test that holds an answer mid-decode would race a loaded machine.
It changes no logit; vLLM loads it by name (``--logits-processors
tests.vllm_slow_steps:SlowSteps``) in its engine process."""

from __future__ import annotations

import time

from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

STEP_S = 0.005


class SlowSteps(LogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory: bool) -> None:
        del vllm_config, device, is_pin_memory

    def is_argmax_invariant(self) -> bool:
        return False  # else greedy batches skip it, and nothing slows

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        del batch_update

    def apply(self, logits):
        time.sleep(STEP_S)
        return logits
