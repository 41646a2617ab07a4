"""How the cascade cuts an answer's text: clauses for synthesis, and each
clause's words spread over the audio chunks that speak them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from duplex_server.models.cascade.clause_buffer import ClauseBuffer, TextStream
from duplex_server.models.cascade.model import clauses, spread


def test_clauses_end_at_marks_followed_by_a_space():
    assert clauses("You said: 3,000 apples, 2.5 kg; fine. Next!") == [
        "You said:",
        "3,000 apples,",
        "2.5 kg;",
        "fine.",
        "Next!",
    ]


def test_words_are_spread_over_the_chunks_in_proportion():
    assert spread("You said: turn on the lights please.", 5) == [
        "You said:",
        " turn",
        " on the ",
        "lights ",
        "please.",
    ]


@given(st.text(alphabet="ab .", max_size=60), st.integers(min_value=1, max_value=40))
def test_slices_join_back_and_end_at_word_ends(text, pieces):
    slices = spread(text, pieces)
    assert len(slices) == pieces
    assert "".join(slices) == text
    at = 0
    for piece in slices[:-1]:
        at += len(piece)
        # a cut never falls inside a word
        assert at in (0, len(text)) or text[at - 1] == " " or text[at] == " "


def test_a_streamed_answer_is_cut_into_clauses_for_speech_as_soon_as_they_end():
    buffer = ClauseBuffer()
    # token by token: a clause is handed on once its mark and a space decoded
    said = [
        buffer.add(piece) for piece in ["Sure", ".", " ", "Y", "ou ", "are 3", ".", "5", ", ok"]
    ]
    assert said == ["", "", "Sure. ", "", "", "", "", "", "You are 3.5, "]
    assert buffer.rest() == "ok"
    assert buffer.rest() == ""


def test_text_streams_piece_by_piece_without_its_outer_whitespace():
    stream = TextStream()
    pieces = ["\n", " Hello", ",", " ", "friend", "!", " ", "\n"]
    sent = [stream.add(piece) for piece in pieces]
    # every piece goes at once; whitespace waits for the words after it
    assert sent == ["", "Hello", ",", "", " friend", "!", "", ""]
    assert "".join(sent) == "Hello, friend!"
