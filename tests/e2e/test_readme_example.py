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
    server = ServerProcess("memory").start()
    try:
        script = tmp_path / "example.py"
        script.write_text(code.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}"))
        result = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=README.parent,
        )
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == "0 completed None 48000"
    assert second.startswith("1 cancelled barge_in ")


def test_readme_agents_sdk_example(tmp_path):
    """The OpenAI Agents SDK example, as printed: it ends when the agent's
    answer is done, so it returns only if the agent ran to the end."""
    text = README.read_text()
    section = text[text.index("## OpenAI clients and agent frameworks") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "RealtimeRunner" in code
    server = ServerProcess("memory").start()
    try:
        script = tmp_path / "agent.py"
        script.write_text(code.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}"))
        result = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=README.parent,
        )
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    assert "Error" not in result.stderr, result.stderr
