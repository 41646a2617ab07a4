"""Where streamed text may be cut into utterances for speech.

Text arrives in fragments (an LLM's tokens, a live caption), and speech
should start at the first complete sentence, not at the end of the input.
A mark only ends a sentence when what follows it says so: ``3.14`` and
``1,000`` have no space after the mark; ``Dr.``, ``e.g.``, ``U.S.`` and the
initials in ``J. R. R. Tolkien`` are followed by a space but name a word,
not an ending. Scripts without spaces between sentences (Chinese,
Japanese) and scripts with their own marks (Devanagari's danda, the Arabic
question mark) end a sentence at the mark itself.

A mark at the very end of the text so far is undecided until the next
fragment (or the flush) arrives: ``Dr`` + ``.`` + ``Smith`` must not be cut.
"""

from __future__ import annotations

import re
from typing import Literal

Granularity = Literal["none", "sentence", "clause"]
GRANULARITIES: tuple[Granularity, ...] = ("none", "sentence", "clause")

# End a sentence when whitespace follows (or the text ends).
_SPACED_SENTENCE_MARKS = frozenset(".!?…‼⁇⁈⁉")
# End a sentence by themselves: CJK full stops and marks, the Devanagari
# danda and double danda, the Arabic question mark and Urdu full stop, the
# Armenian full stop, the Ethiopic full stop, the Myanmar section mark.
_SPACELESS_SENTENCE_MARKS = frozenset("。！？｡．।॥؟۔։።။")
# Clause marks (``clause`` granularity only), on the same two rules.
_SPACED_CLAUSE_MARKS = frozenset(",;:")
_SPACELESS_CLAUSE_MARKS = frozenset("、，；：،؛")
# Closing quotes and brackets stay with the sentence they close.
_CLOSERS = frozenset("\"'”’)]}»」』】〉》）")
# Opening quotes and brackets before the word a period follows.
_RUN = _SPACED_SENTENCE_MARKS | _SPACELESS_SENTENCE_MARKS | _CLOSERS
_OPENERS = "\"'“‘([{«「『【〈《（"

# Words whose period is part of the word (compared lower-case, without it).
ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "etc",
        "inc", "ltd", "co", "corp", "dept", "est", "fig", "gen", "gov", "lt", "col",
        "sgt", "capt", "rev", "hon", "approx", "no", "vol", "ca", "cf", "al",
        "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    }
)  # fmt: skip
# Dotted letters: ``e.g``, ``i.e``, ``U.S``, ``a.m``, ``Ph.D`` (the last period is the mark).
_DOTTED = re.compile(r"(?:[A-Za-z]{1,2}\.)+[A-Za-z]{1,2}")
# One capital letter: an initial (``J. R. R. Tolkien``). "I" is a word.
_INITIAL = re.compile(r"[A-HJ-Z]")
_LAST_WORD = re.compile(r"(\S+)$")


def _word_owns_period(text: str, at: int) -> bool:
    """Whether the single period at ``text[at]`` belongs to the word before it."""
    match = _LAST_WORD.search(text, 0, at)
    if match is None:
        return False
    word = match.group(1).lstrip(_OPENERS)
    return (
        word.lower() in ABBREVIATIONS
        or _DOTTED.fullmatch(word) is not None
        or _INITIAL.fullmatch(word) is not None
    )


class TextSplitter:
    """Buffers fragments; ``push`` returns the pieces that are complete,
    ``flush`` the rest. ``none`` cuts only at the flush."""

    def __init__(self, granularity: Granularity = "sentence") -> None:
        self.granularity = granularity
        self._buffer = ""
        self._scanned = 0  # everything before this has no boundary in it

    @property
    def pending(self) -> str:
        """Text pushed and not yet returned."""
        return self._buffer

    def push(self, text: str) -> list[str]:
        self._buffer += text
        return self._cut(final=False)

    def flush(self) -> list[str]:
        """The end of an utterance: every remaining piece, the last one
        whether or not it ends with a mark."""
        pieces = self._cut(final=True)
        rest = self._buffer.strip()
        self._buffer, self._scanned = "", 0
        return pieces + ([rest] if rest else [])

    def _cut(self, final: bool) -> list[str]:
        if self.granularity == "none":
            return []
        pieces: list[str] = []
        at = self._scanned
        while at < len(self._buffer):
            end = self._boundary_end(at, final)
            if end is None:  # undecided: wait for the next fragment
                break
            if end == 0:
                at += 1
                continue
            piece = self._buffer[:end].strip()
            if piece:
                pieces.append(piece)
            self._buffer = self._buffer[end:]
            at = 0
        self._scanned = at
        return pieces

    def _boundary_end(self, at: int, final: bool) -> int | None:
        """Where the piece ends if a boundary starts at ``at``: 0 if none does
        there, None if the text so far cannot tell."""
        text = self._buffer
        mark = text[at]
        spaced = mark in _SPACED_SENTENCE_MARKS
        spaceless = mark in _SPACELESS_SENTENCE_MARKS
        if self.granularity == "clause":
            spaced = spaced or mark in _SPACED_CLAUSE_MARKS
            spaceless = spaceless or mark in _SPACELESS_CLAUSE_MARKS
        if not (spaced or spaceless):
            return 0
        end = at + 1
        while end < len(text) and (text[end] in _RUN or text[end] == mark):
            end += 1  # "?!" and "..." stay whole; closing quotes follow their sentence
        if end == len(text) and not final:
            return None
        if spaced and end < len(text) and not text[end].isspace():
            return 0  # 3.14, 1,000, "a.b"
        if mark == "." and end == at + 1 and _word_owns_period(text, at):
            return 0
        return end
