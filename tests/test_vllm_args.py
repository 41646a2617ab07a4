"""``--llm-engine-arg``: vLLM's engine arguments checked by vLLM's own parser,
refused at start by name; vLLM's parallelism refused on another backend."""

from __future__ import annotations

import pytest

from duplex_server.engine.llm import LLMConfigError, LLMOptions, build_llm_engine
from duplex_server.engine.llm.vllm_args import passed_engine_args
from tests.e2e.serverproc import run_cli
from tests.vllm_support import assert_vllm_installed, requires_vllm

pytestmark = requires_vllm


def test_pairs_become_vllms_own_types():
    assert_vllm_installed()
    passed = passed_engine_args(
        ("max_num_batched_tokens=4096", "enable-prefix-caching=false", "block_size=32")
    )
    assert passed == {
        "max_num_batched_tokens": 4096,
        "enable_prefix_caching": False,
        "block_size": 32,
    }
    assert passed_engine_args(()) == {}


@pytest.mark.parametrize(
    ("pair", "said"),
    [
        ("no_such_argument=1", "vLLM has no engine argument 'no-such-argument'"),
        ("max_num_batched_tokens=lots", "max-num-batched-tokens"),
        ("max_model_len=128", "set it with --llm-max-model-len"),
        ("tensor_parallel_size=2", "set it with --llm-tensor-parallel-size"),
        ("just-a-word", "give KEY=VALUE"),
    ],
)
def test_a_bad_pair_is_refused_by_name(pair, said):
    with pytest.raises(LLMConfigError, match=said):
        passed_engine_args((pair,))


def test_vllms_settings_are_refused_on_the_transformers_backend(tmp_path):
    for options in (
        LLMOptions(str(tmp_path), backend="transformers", tensor_parallel_size=2),
        LLMOptions(str(tmp_path), backend="transformers", engine_args=("block_size=32",)),
    ):
        with pytest.raises(LLMConfigError, match="is vLLM's: give --llm-backend vllm"):
            build_llm_engine(options)


def test_serve_refuses_an_unknown_engine_argument_at_start(tmp_path):
    result = run_cli(
        "duplex_server.cli",
        "serve",
        "--llm",
        str(tmp_path),
        "--llm-backend",
        "vllm",
        "--llm-kv-cache-bytes",
        "67108864",
        "--llm-engine-arg",
        "max_num_batched_tokens=64,bogus_knob=1",
        "--port",
        "0",
        timeout_s=120,
    )
    assert result.returncode != 0
    assert "vLLM has no engine argument 'bogus-knob'" in result.stderr
