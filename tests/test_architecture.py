"""DESIGN.md's import arrows hold by check, not by discipline: the contracts
in pyproject.toml (``[tool.importlinter]``), run by import-linter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout and "11 kept" in result.stdout, result.stdout


def test_the_server_starts_without_heavy_libraries():
    """torch and transformers are imported only by the backends that use them."""
    code = (
        "import sys, duplex_server.app, duplex_server.cli; "
        "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'diffusers') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_serve_never_loads_the_bench():
    """The bench is its own package: ``duplex-server``'s parser lists ``bench``
    but imports duplex_bench only when bench is the command."""
    code = (
        "import sys, duplex_server.app, duplex_server.cli; duplex_server.cli.parsers(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'duplex_bench'))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
