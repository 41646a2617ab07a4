"""How a streamed answer is cut for speech, and how it is streamed as text.

An LLM hands its answer on token by token. Speech needs whole clauses (a
synthesiser given half a word says it wrong), so :class:`ClauseBuffer` holds
text until a clause ends; text needs no such wait, so :class:`TextStream`
hands every piece on at once, only trimming the answer's outer whitespace
(what a reader never sees, and what the old clause-joined text had none of).
"""

from __future__ import annotations

import re

# Where a clause ends in streamed text: a mark followed by whitespace (the
# cascade's clause rule, so "3,000" and "3.5" stay whole). The whitespace
# must have arrived: until then the mark may be a decimal point.
_CLAUSE_END = re.compile(r"[.!?,;:]\s")


class ClauseBuffer:
    """Text held until a clause ends; ``add`` hands back whole clauses as
    soon as their end (mark and space) has been decoded."""

    def __init__(self) -> None:
        self._pending = ""

    def add(self, text: str) -> str:
        """The complete clauses now ready (possibly several, joined), or ""."""
        self._pending += text
        end = _last_clause_end(self._pending)
        if not end:
            return ""
        ready, self._pending = self._pending[:end], self._pending[end:]
        return ready if ready.strip() else ""

    def rest(self) -> str:
        """What is held when the answer ends (or breaks off): said too."""
        rest, self._pending = self._pending, ""
        return rest if rest.strip() else ""


class TextStream:
    """Every piece on at once, less the answer's leading whitespace; trailing
    whitespace waits for the next words (an answer never ends in it)."""

    def __init__(self) -> None:
        self._held = ""
        self._started = False

    def add(self, piece: str) -> str:
        self._held += piece
        if not self._held.strip():
            return ""
        if not self._started:
            self._held, self._started = self._held.lstrip(), True
        body = self._held.rstrip()
        self._held = self._held[len(body) :]
        return body


def _last_clause_end(text: str) -> int:
    ends = [match.end() for match in _CLAUSE_END.finditer(text)]
    return ends[-1] if ends else 0
