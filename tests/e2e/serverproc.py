"""The tests' server subprocess: the benches' helper with the tests' defaults.

Starting, health waits, kill -9 and stop live in
``duplex_bench.server_process``; here only the socket URL (both event
spellings) and the working directory (the repository) differ.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from duplex_bench import server_process

ROOT = Path(__file__).resolve().parents[2]


class ServerProcess(server_process.ServerProcess):
    def __init__(
        self,
        store: str,
        *extra: str,
        port: int | None = None,
        max_file_bytes: int | None = None,
        max_open_files: int | None = None,
        **flags: server_process.FlagValue,
    ) -> None:
        super().__init__(
            store,
            *extra,
            port=port,
            max_file_bytes=max_file_bytes,
            max_open_files=max_open_files,
            # events=both: the raw test clients see the journal as it is, both spellings
            ws_path="/v1/realtime?duplex=1&events=both",
            cwd=ROOT,
            **flags,
        )


def run_cli(module: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` as a user would, capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )
