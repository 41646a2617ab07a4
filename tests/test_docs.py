"""The docs hold together: the README stays a front page, every relative link
lands on a file (and heading) that exists, and every decision record says
its context, its decision and its consequences.

Why a test: the README grew to 2,188 lines and the decisions to a diary
(issue 35); links into docs/ break silently when a page moves."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DECISIONS = DOCS / "decisions"

README_MAX_LINES = 400

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks: a link in a code sample is not a link."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation
    other than '-' and '_' removed, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = []
    for char in text:
        category = unicodedata.category(char)
        if char in "-_ " or category[0] in "LN":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose_lines(path.read_text()):
        match = _HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        found.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return found


def relative_links(path: Path) -> list[str]:
    """The relative link targets of a markdown file, outside code."""
    targets = []
    for line in _prose_lines(path.read_text()):
        for match in _LINK.finditer(_INLINE_CODE.sub("", line)):
            target = match.group(1).strip("<>")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
                continue
            targets.append(target)
    return targets


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def decision_records() -> list[Path]:
    return sorted(p for p in DECISIONS.glob("*.md") if p.name != "README.md")


def test_there_are_decision_records():
    assert len(decision_records()) >= 10


@pytest.mark.parametrize("path", decision_records(), ids=lambda p: p.name)
def test_decision_record_has_context_decision_consequences(path: Path):
    matches = map(_HEADING.match, _prose_lines(path.read_text()))
    headings = [m.group(2) for m in matches if m and m.group(1) == "##"]
    assert headings[:3] == ["Context", "Decision", "Consequences"], headings


def test_every_decision_record_is_in_the_index():
    index = (DECISIONS / "README.md").read_text()
    missing = [p.name for p in decision_records() if f"]({p.name})" not in index]
    assert not missing, missing


def test_slug_rules():
    conformance = "openai-semantics-the-conformance-table"
    assert github_slug("OpenAI semantics: the conformance table") == conformance
    assert github_slug("`bench batch`: the routes' cost") == "bench-batch-the-routes-cost"
    assert github_slug("Known gaps") == "known-gaps"
