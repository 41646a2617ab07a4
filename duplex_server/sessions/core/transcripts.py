"""Partial transcripts that never take back a word (PROTOCOL.md: transcript
deltas add up to the completed text).

A partial transcript re-decodes the utterance so far, and a later decode may
revise what an earlier one heard ("what is that" becomes "what is the
weather"). A delta told is told for good, so only the words two decodes in a
row agree on are told (and never the last word of the newest, which the
speech may still be in the middle of); the final transcript then keeps the
words told and adds what follows them. Pure text in, text out.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\S+\s*")


def _words(text: str) -> list[re.Match[str]]:
    return list(_WORD.finditer(text))


def stable_prefix(previous: str, current: str) -> str:
    """The start of ``current`` that ``previous`` agrees with, in whole words
    (each with the space after it), short of ``current``'s last word."""
    agreed_end = 0
    before = [match.group().strip() for match in _words(previous)]
    for index, match in enumerate(_words(current)[:-1]):
        if index >= len(before) or before[index] != match.group().strip():
            break
        agreed_end = match.end()
    return current[:agreed_end]


def reconcile(told: str, final: str) -> str:
    """The final transcript as the client can be told it: ``final`` when it
    starts with what the deltas told; else the words told, then the final's
    words after as many words as were told."""
    if final.startswith(told):
        return final
    skip = len(_words(told))
    rest = _words(final)[skip:]
    if not rest:
        return told.rstrip()
    return told + final[rest[0].start() :]
