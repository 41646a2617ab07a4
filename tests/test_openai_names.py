"""The pure parts of OpenAI's semantics: which names a model answers to
(core/model_names.py) and partial transcripts that never take a word back
(core/transcripts.py)."""

from __future__ import annotations

import pytest

from duplex_server.sessions.core.model_names import ModelNames, opening_model
from duplex_server.sessions.core.transcripts import reconcile, stable_prefix
from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate


@pytest.mark.parametrize(
    ("name", "answers"),
    [
        ("cascade", True),
        ("gpt-realtime", True),
        ("gpt-realtime-2.1", True),  # the Agents SDK's default
        ("gpt-realtime-mini-2025-10-06", True),
        ("gpt-4o-realtime-preview-2024-12-17", True),
        ("gpt-4o-mini-realtime-preview", True),
        ("gpt-realtimes", False),
        ("gpt-4o", False),
        ("whisper-1", False),
    ],
)
def test_openais_realtime_names_are_aliases(name, answers):
    assert ModelNames.of("cascade").answers_to(name) is answers


def test_served_names_and_no_aliases():
    names = ModelNames(("house", "backup"), openai_aliases=False)
    assert names.default == "house" and names.listed() == ["house", "backup"]
    assert names.answers_to("backup") and not names.answers_to("gpt-realtime")
    listed = ModelNames.of("echo").listed()
    assert listed[0] == "echo" and "gpt-realtime" in listed


def test_the_opening_model_is_the_name_asked_for_or_refused():
    names = ModelNames.of("echo")
    assert opening_model(SessionUpdate(), names).model == "echo"
    assert opening_model(SessionUpdate(model="gpt-realtime"), names).model == "gpt-realtime"
    with pytest.raises(ProtocolError) as refused:
        opening_model(SessionUpdate(model="llama"), names)
    assert (refused.value.code, refused.value.param) == ("model_not_found", "session.model")


@pytest.mark.parametrize(
    ("previous", "current", "stable"),
    [
        ("", "hello", ""),
        ("hello", "hello there", "hello"),
        ("what is that", "what is the weather", "what is"),
        ("what is the", "what is the weather", "what is the"),
        ("yellow", "hello there", ""),
        ("a  b c", "a  b c d", "a  b c"),  # the text's own spacing is kept
    ],
)
def test_only_words_two_decodes_agree_on_are_stable(previous, current, stable):
    assert stable_prefix(previous, current) == stable
    assert current.startswith(stable)


@pytest.mark.parametrize(
    ("told", "final", "kept"),
    [
        ("", "What is the weather?", "What is the weather?"),
        ("what is", "what is the weather", "what is the weather"),
        # a revision of told words keeps what was told, then the final's rest
        ("what is", "What is the weather like today?", "what is the weather like today?"),
        ("what is", "what's the weather", "what is the weather"),
        ("I want to", "I wanna go home", "I want to go home"),
        ("what time", "what's the time now", "what time now"),
        ("hello there", "hello", "hello there"),  # nothing after the told words
    ],
)
def test_the_final_transcript_starts_with_what_was_told(told, final, kept):
    assert reconcile(told, final) == kept
    assert kept.startswith(told)
