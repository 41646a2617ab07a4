"""Word error rate of a transcript against its reference text.

Both sides are normalised first, as Whisper's own English normaliser would,
so that a recogniser is not charged for spelling a word differently: case,
punctuation and hyphens go, numbers are spelled out ("10" is "ten"), and
"Mr" is "mister" (the references say "mister john dashwood"). What is left
is counted as substitutions, deletions and insertions over the reference's
words (Levenshtein on words); a rate can pass 1 when a recogniser invents
words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SPELLINGS = {"mr": "mister", "mrs": "missus", "ok": "okay"}


def _number(n: int) -> str:
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens - 2] + (f" {_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {_number(rest)}" if rest else "")
    return " ".join(_ONES[int(digit)] for digit in str(n))  # a code, read digit by digit


def words(text: str) -> list[str]:
    """``text`` as the normalised words that are compared."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"\d+", lambda match: f" {_number(int(match.group()))} ", text)
    text = re.sub(r"[^a-z' ]+", " ", text).replace("'", "")
    return [_SPELLINGS.get(word, word) for word in text.split()]


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    """Substitutions + deletions + insertions turning ``reference`` into ``hypothesis``."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i]
        for j, hyp in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class Score:
    errors: int
    reference_words: int

    @property
    def rate(self) -> float | None:
        return self.errors / self.reference_words if self.reference_words else None


def score(reference: str, hypothesis: str) -> Score:
    ref = words(reference)
    return Score(edit_distance(ref, words(hypothesis)), len(ref))


def total(scores: list[Score]) -> Score:
    """Errors and words over several utterances: their pooled rate, not the mean of rates."""
    return Score(sum(s.errors for s in scores), sum(s.reference_words for s in scores))
