"""duplex_server.surface: the face the bench and other tools import
(docs/DESIGN.md's layout; pyproject's "the bench sees the server only
through its surface" contract)."""

import subprocess
import sys


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return done.stdout.strip()


def test_importing_the_surface_loads_no_heavy_library() -> None:
    loaded = _run(
        "import sys, duplex_server.surface\n"
        "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'diffusers', 'av')"
        " if m in sys.modules))"
    )
    assert loaded == "[]"


def test_every_name_of_the_surface_resolves() -> None:
    # the lazy ones import their backend (torch and all) on first access
    missing = _run(
        "import duplex_server.surface as s\n"
        "print([n for n in s.__all__ if getattr(s, n, None) is None])"
    )
    assert missing == "[]"
