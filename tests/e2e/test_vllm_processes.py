"""vLLM's engine processes never outlive the server: a real ``serve
--llm-backend vllm`` process, stopped with SIGTERM or SIGINT, or killed with
SIGKILL (no code of the server runs), leaves none of them behind."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request

import psutil
import pytest

from duplex_bench.tiny_llm import trained_qwen_chat_model
from tests.e2e.serverproc import ServerProcess
from tests.vllm_support import SERVE_FLAGS, assert_vllm_installed, requires_vllm

pytestmark = requires_vllm

# Bounds on a broken start or stop, not measurements.
START_S = 600.0
GONE_S = 60.0


def ready(server: ServerProcess) -> bool:
    try:
        with urllib.request.urlopen(server.http_url + "/ready", timeout=5):
            return True
    except urllib.error.HTTPError as unready:
        assert unready.code == 503
        return False


def engine_server(model: str) -> ServerProcess:
    server = ServerProcess("memory", *SERVE_FLAGS, model="cascade", llm=model)
    server.start(timeout_s=START_S)
    deadline = time.monotonic() + START_S
    while not ready(server):
        assert server.proc is not None and server.proc.poll() is None, server.log_text()
        assert time.monotonic() < deadline, server.log_text()
        time.sleep(0.2)
    return server


def wait_gone(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` still running after GONE_S."""
    deadline = time.monotonic() + GONE_S
    alive = processes
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [process for process in alive if running(process)]
    return alive


def running(process: psutil.Process) -> bool:
    """Alive, not a zombie (an orphan is reaped by whoever adopted it)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_no_engine_process_outlives_the_server(tmp_path_factory, stop):
    assert_vllm_installed()
    model = trained_qwen_chat_model(tmp_path_factory.getbasetemp())
    server = engine_server(str(model))
    try:
        descendants = psutil.Process(server.pid).children(recursive=True)
        names = [p.name() for p in descendants]
        # the reaper, vLLM's engine core and its worker (at least)
        assert len(descendants) >= 3, names
        server.proc.send_signal(stop)  # type: ignore[union-attr]
        server.proc.wait(timeout=GONE_S)  # type: ignore[union-attr]
        assert wait_gone(descendants) == [], (names, server.log_text())
    finally:
        server.stop()
