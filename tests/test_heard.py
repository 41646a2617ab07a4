"""Hearing decides, the pipeline writes: what server VAD's transitions turn
into (runtime.hearing) and what those commands record (core.heard), with no
server and no actor."""

from __future__ import annotations

import msgspec

from duplex_server.models import build_model
from duplex_server.sessions.core.commands import HeardTurn, ModelFacts
from duplex_server.sessions.core.effects import Effects, StartAnswer, StopAnswer
from duplex_server.sessions.core.heard import (
    DeferredTurnDue,
    OverlapResolved,
    PartialHeard,
    RemarkDropped,
    SpeechStart,
    TurnEnded,
)
from duplex_server.sessions.core.pipeline import Command, step
from duplex_server.sessions.core.state import SessionState, fold, initial_state
from duplex_server.sessions.core.turns import Transition
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.hearing import Hearing
from protocol import client_events as ce
from protocol.errors import ProtocolError
from protocol.session_config import InputTranscription, TurnDetection
from tests.wsclient import b64, tone_pcm16

MODEL = build_model("echo")


class Session:
    """A session driven the way the actor drives it: every command stepped,
    every record kept, every event's type noted."""

    def __init__(
        self, overlap_policy: str = "barge_in_on_speech", create_response: bool = True
    ) -> None:
        self.overlap_policy = overlap_policy
        self.create_response = create_response
        self.state = self.initial()
        self.log: list = []
        self.events: list[str] = []
        self.sent: list[dict] = []
        self.clock = 1000

    def initial(self) -> SessionState:
        """A server VAD session (set here: echo itself has no ears)."""
        state = initial_state("sess_heard001", MODEL.name, MODEL.turn_detection_types)
        state.config.turn_detection = TurnDetection(
            type="server_vad",
            create_response=self.create_response,
            interrupt_response=True,
            prefix_padding_ms=300,
        )
        state.config.overlap_policy = self.overlap_policy
        return state

    def run(self, command: Command, heard: HeardTurn | None = None):
        self.clock += 10
        batch, effects = step(self.state, command, ModelFacts(MODEL), self.clock, heard)
        self.log.extend(batch.records)
        sent = [msgspec.json.decode(payload) for _, payload in batch.outbound]
        self.sent += sent
        self.events += [event["type"] for event in sent]
        return effects

    def speak(self, ms: float = 200) -> None:
        self.run(ce.InputAudioAppend(audio=b64(tone_pcm16(ms))))

    def answering(self) -> str:
        """Start an answer (a text turn) and return its response id."""
        self.run(ce.InputTextAppend(text="hello"))
        effects = self.run(ce.InputAudioCommit(response_create=True))
        [start] = [e for e in effects if isinstance(e, StartAnswer)]
        return start.response.id

    def refold(self) -> SessionState:
        return fold(self.log, self.initial())


def _stopped(effects: Effects) -> list[str]:
    return [e.response_id for e in effects if isinstance(e, StopAnswer)]


def test_speech_over_an_answer_is_a_barge_in_once_it_lasts():
    session, hearing = Session(), Hearing(MODEL, lambda message: None)
    response_id = session.answering()
    start = hearing.decide(session.state, Transition("speech_started", 5000.0))
    assert start == SpeechStart(5000.0, cut_answer=False)
    session.run(start)
    assert session.state.response is not None  # the duplex wire waits for sustained speech
    sustained = hearing.decide(session.state, Transition("speech_sustained", 5400.0))
    assert sustained == OverlapResolved("barge_in", 400.0, response_id)
    effects = session.run(sustained)
    assert _stopped(effects) == [response_id] and session.state.response is None
    stopped = hearing.decide(session.state, Transition("speech_stopped", 6000.0))
    assert stopped == TurnEnded(6000.0, response_create=True, deferred=False)


def test_openai_semantics_cut_the_answer_when_speech_starts():
    session, hearing = Session(), Hearing(MODEL, lambda message: None)
    session.state.config.openai_semantics = True
    response_id = session.answering()
    start = hearing.decide(session.state, Transition("speech_started", 5000.0))
    assert start == SpeechStart(5000.0, cut_answer=True)
    effects = session.run(start)
    assert _stopped(effects) == [response_id]
    cut = session.events[session.events.index("input_audio_buffer.speech_started") :]
    # OpenAI's events only: the cut, without the duplex wire's overlap.decision
    # and turn.events (core/event_dialect.py)
    assert cut[:2] == ["input_audio_buffer.speech_started", "response.output_audio.done"]
    assert "response.done" in cut and cut[-1] == "output_audio_buffer.cleared"
    assert not {"overlap.decision", "turn.event"} & set(cut)
    # already resolved: sustained speech decides nothing more
    assert hearing.decide(session.state, Transition("speech_sustained", 5400.0)) is None


def test_a_short_remark_is_dropped_and_the_answer_goes_on():
    session, hearing = Session(), Hearing(MODEL, lambda message: None)
    response_id = session.answering()
    session.run(hearing.decide(session.state, Transition("speech_started", 5000.0)))
    session.speak(150)
    dropped = hearing.decide(session.state, Transition("speech_stopped", 5150.0))
    assert dropped == RemarkDropped(5150.0, 150.0, response_id)
    session.run(dropped)
    assert session.state.response is not None and session.state.response.id == response_id
    assert not session.state.input.chunks  # the remark is not a turn
    # the answer has the floor again once the remark stops
    assert session.events[-3:] == ["overlap.decision", "input_audio_buffer.cleared", "turn.event"]


def test_listen_only_defers_the_turn_until_the_answer_ends():
    session, hearing = Session("listen_only"), Hearing(MODEL, lambda message: None)
    response_id = session.answering()
    session.run(hearing.decide(session.state, Transition("speech_started", 5000.0)))
    session.speak(600)
    sustained = hearing.decide(session.state, Transition("speech_sustained", 5400.0))
    assert sustained == OverlapResolved("listen", 400.0, response_id)
    session.run(sustained)
    ended = hearing.decide(session.state, Transition("speech_stopped", 5600.0))
    assert isinstance(ended, TurnEnded) and ended.deferred
    effects = session.run(ended)
    assert not any(isinstance(e, StartAnswer) for e in effects)
    assert session.state.response.id == response_id
    assert hearing.answer_ended() is None  # not recorded yet: nothing is owed
    hearing.recorded(ended)
    session.run(ce.ResponseCancel())
    due = hearing.answer_ended()
    assert due == DeferredTurnDue()
    # the deferred turn is answered now
    assert any(isinstance(e, StartAnswer) for e in session.run(due))
    assert hearing.answer_ended() is None  # once
    assert session.refold() == session.state


def _transcribing_openai(session: Session) -> None:
    session.state.config.openai_semantics = True
    session.state.config.input_audio_transcription = InputTranscription(model="whisper-1")


def transcribing_on_openais_endpoint() -> tuple[Session, Hearing]:
    """A session on the OpenAI endpoint with transcription on, the user
    600 ms into speaking."""
    session, hearing = Session(), Hearing(MODEL, lambda message: None)
    _transcribing_openai(session)
    session.run(hearing.decide(session.state, Transition("speech_started", 0.0)))
    session.speak(600)
    return session, hearing


def test_partial_transcripts_tell_only_words_two_decodes_agree_on():
    """A told word is never taken back (core/transcripts.py): a partial tells
    the words it and the decode before it agree on, short of its last word."""
    session, hearing = transcribing_on_openais_endpoint()
    item_id = f"item_{session.state.session_id[-10:]}_u1"
    # the first decode has nothing to agree with; the second agrees on "hello "
    assert hearing.partial(session.state, mb.Partial(item_id, "hello")) is None
    first = hearing.partial(session.state, mb.Partial(item_id, "hello there"))
    assert first == PartialHeard(item_id, "hello")
    session.run(first)
    hearing.recorded(first)
    told = hearing.partial(session.state, mb.Partial(item_id, "hello there my friend"))
    assert told == PartialHeard(item_id, " there")  # a word with the space before it
    session.run(told)
    hearing.recorded(told)
    # a revised hypothesis, or one for another item, is not told
    assert hearing.partial(session.state, mb.Partial(item_id, "yellow theirs")) is None
    assert hearing.partial(session.state, mb.Partial("item_other", "hello there")) is None
    assert session.events[-1] == "conversation.item.input_audio_transcription.delta"


def test_a_cleared_buffer_starts_the_told_words_afresh():
    """The next utterance becomes the same item after a clear: what the
    partials told of the cleared one is not carried into it."""
    session, hearing = transcribing_on_openais_endpoint()
    item_id = f"item_{session.state.session_id[-10:]}_u1"
    hearing.partial(session.state, mb.Partial(item_id, "uh huh"))
    told = hearing.partial(session.state, mb.Partial(item_id, "uh huh yeah"))
    assert told == PartialHeard(item_id, "uh huh")
    session.run(told)
    hearing.recorded(told)
    session.run(ce.InputAudioClear())
    session.speak(600)  # the user speaks on: the VAD never stopped
    assert hearing.partial(session.state, mb.Partial(item_id, "what time")) is None
    again = hearing.partial(session.state, mb.Partial(item_id, "what time is"))
    assert again == PartialHeard(item_id, "what time")


def test_duplex_captions_run_ahead_of_the_stable_words():
    """The duplex wire's partials are live captions the final replaces: each
    decode that extends what was told is told whole (last word included)."""
    session, hearing = Session(), Hearing(MODEL, lambda message: None)
    session.run(hearing.decide(session.state, Transition("speech_started", 0.0)))
    session.speak(600)
    item_id = f"item_{session.state.session_id[-10:]}_u1"
    first = hearing.partial(session.state, mb.Partial(item_id, "hello"))
    assert first == PartialHeard(item_id, "hello")
    session.run(first)
    hearing.recorded(first)
    assert hearing.partial(session.state, mb.Partial(item_id, "hello there")) == PartialHeard(
        item_id, " there"
    )
    assert hearing.partial(session.state, mb.Partial(item_id, "yellow")) is None


def test_the_commit_tells_the_rest_so_deltas_add_up():
    """OpenAI's endpoint: the commit's last delta is what the partials did
    not tell, so the deltas concatenate to the completed transcript."""
    session = Session()
    _transcribing_openai(session)
    session.run(SpeechStart(0.0))
    session.speak(300)
    item_id = f"item_{session.state.session_id[-10:]}_u1"
    session.run(PartialHeard(item_id, "what is"))
    heard = HeardTurn("what is the weather", told="what is")
    session.run(TurnEnded(300.0, response_create=False), heard)
    deltas = [e for e in session.sent if e["type"].endswith("transcription.delta")]
    (completed,) = [e for e in session.sent if e["type"].endswith("transcription.completed")]
    assert "".join(d["delta"] for d in deltas) == completed["transcript"] == "what is the weather"


def test_a_failed_recognition_is_told_before_the_turn_it_spoils():
    session = Session()
    session.run(SpeechStart(0.0))
    session.speak(300)
    failure = ProtocolError("engine_error", "recogniser crashed")
    session.run(TurnEnded(300.0, response_create=False), HeardTurn(error=failure))
    assert session.events[-7:] == [
        "error",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.created",
        "conversation.item.done",
        "turn.event",  # user_committed: the turn waits for its answer
    ]
    assert session.state.items[-1].role == "user" and session.state.response is None
    assert session.refold() == session.state


def test_a_second_turn_in_the_same_append_stops_without_an_empty_commit():
    """Speech, pause, speech, pause in one chunk: the first commit takes it
    all; the second stop is recorded (the user is no longer speaking) and
    commits nothing, instead of refusing a commit nobody sent."""
    session = Session(create_response=False)
    hearing = Hearing(MODEL, lambda message: None)
    session.run(hearing.decide(session.state, Transition("speech_started", 100.0)))
    session.speak(2000)
    first = hearing.decide(session.state, Transition("speech_stopped", 700.0))
    session.run(first, HeardTurn())
    session.run(hearing.decide(session.state, Transition("speech_started", 1200.0)))
    second = hearing.decide(session.state, Transition("speech_stopped", 1800.0))
    assert isinstance(second, TurnEnded)
    committed = len(session.state.items)
    session.run(second)
    assert not session.state.user_speaking
    assert len(session.state.items) == committed
    assert session.events[-2:] == ["input_audio_buffer.speech_stopped", "turn.event"]
    assert session.refold() == session.state
