"""``--llm PATH --llm-backend vllm`` refused at start when vLLM's CPU build
would have to guess its KV cache's size. (The vLLM cascade answering
through the real server, and ``/ready`` saying 503 while the engine loads,
are in tests/e2e/test_llm_backends.py, on one server shared by its tests.)"""

from __future__ import annotations

import pytest

from duplex_server import cli
from tests.vllm_support import assert_vllm_installed, requires_vllm

pytestmark = requires_vllm


def test_vllm_without_a_kv_cache_size_is_refused_at_start(tmp_path):
    assert_vllm_installed()
    from duplex_server.app import create_app

    config = cli.serve_config(["--llm", str(tmp_path), "--llm-backend", "vllm"], {})
    with pytest.raises(ValueError, match="needs --llm-kv-cache-bytes"):
        create_app(config)
