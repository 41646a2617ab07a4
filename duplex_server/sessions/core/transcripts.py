"""Partial transcripts that never take back a word (PROTOCOL.md: transcript
deltas add up to the completed text).

A partial transcript re-decodes the utterance so far, and a later decode may
revise what an earlier one heard ("what is that" becomes "what is the
weather"). A delta told is told for good, so only the words two decodes in a
row agree on are told (and never the last word of the newest, which the
speech may still be in the middle of); a word is told with the space before
it, as OpenAI's deltas are. The final transcript then keeps the words told
and adds what the final decode heard after them. Pure text in, text out.
"""

from __future__ import annotations

import difflib
import re

_WORD = re.compile(r"\S+")
_PUNCTUATION = re.compile(r"[^\w']+")


def _words(text: str) -> list[re.Match[str]]:
    return list(_WORD.finditer(text))


def _plain(word: str) -> str:
    return _PUNCTUATION.sub("", word).lower()


def stable_prefix(previous: str, current: str) -> str:
    """The start of ``current`` that ``previous`` agrees with, in whole words,
    short of ``current``'s last word (no trailing space: the next delta
    brings the space before its word)."""
    agreed_end = 0
    before = [match.group() for match in _words(previous)]
    for index, match in enumerate(_words(current)[:-1]):
        if index >= len(before) or before[index] != match.group():
            break
        agreed_end = match.end()
    return current[:agreed_end]


def reconcile(told: str, final: str) -> str:
    """The final transcript as the client can be told it: ``final`` when it
    starts with what the deltas told; else the words told, then what
    ``final`` says after them. Words are aligned ignoring case and
    punctuation; told words past the last match stand for the final's words
    whose middle falls within as many characters (a revision rarely changes
    the length of what was said much)."""
    if final.startswith(told):
        return final
    told_words = [_plain(m.group()) for m in _words(told)]
    final_matches = _words(final)
    final_words = [_plain(m.group()) for m in final_matches]
    matcher = difflib.SequenceMatcher(a=told_words, b=final_words, autojunk=False)
    matched = [block for block in matcher.get_matching_blocks() if block.size]
    told_end, skip = (
        (matched[-1].a + matched[-1].size, matched[-1].b + matched[-1].size) if matched else (0, 0)
    )
    unmatched_chars = len(" ".join(told_words[told_end:]))
    consumed = -1  # no space before the first word
    while skip < len(final_words) and unmatched_chars > 0:
        width = len(final_words[skip]) + 1
        if consumed + 1 + width / 2 > unmatched_chars:
            break
        consumed += width
        skip += 1
    if skip >= len(final_matches):
        return told
    return told + final[final_matches[skip - 1].end() :] if skip else final
