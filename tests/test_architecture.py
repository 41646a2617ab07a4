"""DESIGN.md's import arrows hold by check, not by discipline: the contracts
in pyproject.toml (``[tool.importlinter]``), run by import-linter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout and "14 kept" in result.stdout, result.stdout


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


PRODUCT = ("protocol", "clients", "duplex_server", "batch_api")


def import_circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of modules that import each other round (the strongly
    connected components of more than one module, Tarjan's algorithm), over
    every import: at the top, inside functions, under ``TYPE_CHECKING``."""
    order: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = lowest[module] = len(order)
        stack.append(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in order:
                visit(imported)
                lowest[module] = min(lowest[module], lowest[imported])
            elif imported in stack:
                lowest[module] = min(lowest[module], order[imported])
        if lowest[module] == order[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in order:
            visit(module)
    return circles


def test_the_product_has_no_import_circles():
    """A circle is a layering the contracts cannot name (two modules each
    needing the other); the cure is the piece they share, in a module of its
    own (as ``models/cascade/payload.py`` and ``engine/llm/interface.py``)."""
    graph = grimp.build_graph(*PRODUCT, cache_dir=None)
    assert import_circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for module in ("a", "a.one", "a.two", "a.three"):
        graph.add_module(module)
    graph.add_import(importer="a.one", imported="a.two")
    graph.add_import(importer="a.two", imported="a.one")
    graph.add_import(importer="a.two", imported="a.three")
    assert import_circles(graph) == [["a.one", "a.two"]]
