"""Where the speech stream cuts text: a table of cases, each run whole and
fed one character at a time (a mark at the end of a fragment must wait for
what follows it)."""

from __future__ import annotations

import pytest

from batch_api.text_split import Granularity, TextSplitter

SENTENCE_CASES: list[tuple[str, list[str]]] = [
    ("Hello there. How are you?", ["Hello there.", "How are you?"]),
    ("Pi is 3.14 today. Really!", ["Pi is 3.14 today.", "Really!"]),
    ("It costs 1,000 dollars. Cheap.", ["It costs 1,000 dollars.", "Cheap."]),
    ("Dr. Smith is in. Mrs. Jones is out.", ["Dr. Smith is in.", "Mrs. Jones is out."]),
    ("Bring fruit, e.g. apples. Thanks.", ["Bring fruit, e.g. apples.", "Thanks."]),
    ("That is, i.e. this one. Yes.", ["That is, i.e. this one.", "Yes."]),
    ("He moved to the U.S. in May. Then back.", ["He moved to the U.S. in May.", "Then back."]),
    ("J. R. R. Tolkien wrote it. Read it.", ["J. R. R. Tolkien wrote it.", "Read it."]),
    ("So did I. Then we left.", ["So did I.", "Then we left."]),
    ("Wait... what?! No way.", ["Wait...", "what?!", "No way."]),
    ('She said "stop." Then ran.', ['She said "stop."', "Then ran."]),
    ("In 2024. Next year.", ["In 2024.", "Next year."]),
    ("你好。今天天气很好！你呢？", ["你好。", "今天天气很好！", "你呢？"]),
    ("「はい。」そうです。", ["「はい。」", "そうです。"]),
    ("मैं घर जा रहा हूँ। तुम कहाँ हो।", ["मैं घर जा रहा हूँ।", "तुम कहाँ हो।"]),
    ("كيف حالك؟ أنا بخير.", ["كيف حالك؟", "أنا بخير."]),
    ("No mark at the end", ["No mark at the end"]),
    ("   ", []),
]

CLAUSE_CASES: list[tuple[str, list[str]]] = [
    ("First, second; third: fourth.", ["First,", "second;", "third:", "fourth."]),
    ("It costs 1,000 dollars, or 3.5 euros.", ["It costs 1,000 dollars,", "or 3.5 euros."]),
    ("我们走吧，好不好？", ["我们走吧，", "好不好？"]),
    ("Dr. Who, e.g. the doctor.", ["Dr. Who,", "e.g. the doctor."]),
]


def split_whole(text: str, granularity: Granularity) -> list[str]:
    splitter = TextSplitter(granularity)
    return splitter.push(text) + splitter.flush()


def split_by_character(text: str, granularity: Granularity) -> list[str]:
    splitter = TextSplitter(granularity)
    pieces = [piece for char in text for piece in splitter.push(char)]
    return pieces + splitter.flush()


@pytest.mark.parametrize("split", [split_whole, split_by_character])
@pytest.mark.parametrize(("text", "expected"), SENTENCE_CASES)
def test_sentences(split, text: str, expected: list[str]) -> None:
    assert split(text, "sentence") == expected


@pytest.mark.parametrize("split", [split_whole, split_by_character])
@pytest.mark.parametrize(("text", "expected"), CLAUSE_CASES)
def test_clauses(split, text: str, expected: list[str]) -> None:
    assert split(text, "clause") == expected


def test_none_cuts_only_at_the_flush() -> None:
    splitter = TextSplitter("none")
    assert splitter.push("One. Two! Three?") == []
    assert splitter.flush() == ["One. Two! Three?"]
    assert splitter.flush() == []


def test_a_complete_sentence_leaves_before_the_flush() -> None:
    splitter = TextSplitter("sentence")
    assert splitter.push("Hello") == []
    assert splitter.push(" world.") == []  # the period may be an abbreviation's
    assert splitter.push(" Next") == ["Hello world."]
    assert splitter.pending == " Next"
    assert splitter.push(" one? And") == ["Next one?"]
    assert splitter.flush() == ["And"]


def test_an_abbreviation_at_a_fragment_end_waits_for_the_next() -> None:
    splitter = TextSplitter("sentence")
    assert splitter.push("Ask Dr.") == []
    assert splitter.push(" Smith now. ") == ["Ask Dr. Smith now."]
    assert splitter.flush() == []
