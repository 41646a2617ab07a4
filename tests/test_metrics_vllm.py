"""vLLM's own series on the server's /metrics: its stat loggers are on, its
Prometheus logger records into ``prometheus_client``'s global registry, and
the app's registry serves that one beside the ``duplex_*`` series. A real
server with the tiny Qwen2 model on vLLM's CPU build answers one question;
the ``vllm:*`` series then count it."""

from __future__ import annotations

import httpx
from openai import AsyncOpenAI

from duplex_bench.tiny_llm import CAPITAL, CAPITAL_QUESTIONS, trained_qwen_chat_model
from duplex_server import cli
from tests.conftest import free_port, running_server
from tests.e2e.test_llm_backends import wait_ready
from tests.e2e.test_llm_cascade import text_answer
from tests.scrape import grew, scrape
from tests.vllm_support import SERVE_FLAGS, assert_vllm_installed, requires_vllm

pytestmark = requires_vllm


async def test_vllm_series_reach_the_servers_metrics(tmp_path_factory):
    assert_vllm_installed()
    path = trained_qwen_chat_model(tmp_path_factory.getbasetemp())
    config = cli.serve_config(["--llm", str(path), *SERVE_FLAGS], {})
    config.port = free_port()
    async with running_server(config) as running, httpx.AsyncClient() as http:
        model = running.app.state.model
        try:
            await wait_ready(http, running.http_url, model)
            before = await scrape(running.http_url)
            sdk = AsyncOpenAI(api_key="unused", base_url=f"{running.http_url}/v1")
            async with sdk.realtime.connect(model="cascade") as connection:
                assert (await connection.recv()).type == "session.created"
                await connection.session.update(
                    session={"type": "realtime", "output_modalities": ["text"]}
                )
                assert await text_answer(connection, CAPITAL_QUESTIONS[0]) == CAPITAL
            after = await scrape(running.http_url)
            text = (await http.get(f"{running.http_url}/metrics")).text
        finally:
            model.responder.engine.core.backend.close()

    vllm = {name for name in after if name.startswith("vllm:")}
    assert {"vllm:time_to_first_token_seconds", "vllm:request_success"} <= vllm, sorted(vllm)
    ttft = "vllm:time_to_first_token_seconds"
    assert grew(before, after, ttft, f"{ttft}_count", **_labels(after, ttft)) == 1
    assert grew(before, after, "duplex_llm_ttft_seconds", "duplex_llm_ttft_seconds_count") == 1
    # each family once: the standard collectors, in both registries, are served once
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert "process_resident_memory_bytes" in types and len(types) == len(set(types))


def _labels(families, family: str) -> dict[str, str]:
    """The labels of the family's ``_count`` sample (vLLM labels by model and engine)."""
    (labels,) = [dict(key) for name, key in families[family] if name == f"{family}_count"]
    return labels
