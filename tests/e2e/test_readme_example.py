"""The README's client example runs, against a real server, as printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.e2e.serverproc import ServerProcess

README = Path(__file__).resolve().parents[2] / "README.md"


def client_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python client") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_client_example(tmp_path):
    code = client_example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 15
    result = _run_example(tmp_path, code)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == "0 completed None 48000"
    assert second.startswith("1 cancelled barge_in ")


def _example_after(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run_example(tmp_path, code: str) -> subprocess.CompletedProcess:
    server = ServerProcess("memory").start()
    try:
        script = tmp_path / "example.py"
        script.write_text(code.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}"))
        return subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=README.parent,
        )
    finally:
        server.stop()


def test_readme_agents_sdk_example(tmp_path):
    """The OpenAI Agents SDK example, as printed: it ends when the agent's
    answer is done, so it returns only if the agent ran to the end."""
    code = _example_after("## OpenAI clients and agent frameworks")
    assert "RealtimeRunner" in code
    result = _run_example(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert "Error" not in result.stderr, result.stderr


def test_readme_openai_sdk_example(tmp_path):
    """The stock openai SDK example, as printed: one manual turn, answered."""
    code = _example_after("Talk to it from Python with the stock `openai` SDK")
    assert "client.realtime.connect" in code
    result = _run_example(tmp_path, code)
    assert result.returncode == 0, result.stderr
    printed = result.stdout.splitlines()
    assert printed[0] == "input_audio_buffer.committed" and printed[-1] == "response.done"
    assert "response.created" in printed and "error" not in printed
