"""The pure fold, driven through the command handlers without any I/O."""

from __future__ import annotations

import msgspec
import pytest

from duplex_server.models import build_model
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import HeardTurn, ModelFacts, PreparedAppend
from duplex_server.sessions.core.effects import StartAnswer, StopAnswer
from duplex_server.sessions.core.model_port import ModelChunk
from duplex_server.sessions.core.pipeline import step
from duplex_server.sessions.core.records import CommitBody, Record
from duplex_server.sessions.core.responses import emit_chunk, finish_response
from duplex_server.sessions.core.state import SessionState, fold, initial_state
from protocol import client_events as ce
from protocol.errors import ProtocolError
from tests.wsclient import b64, tone_pcm16

MODEL = build_model("echo")


class Script:
    """Runs commands the way the actor does and keeps the log it would append."""

    def __init__(self) -> None:
        self.state = initial_state("sess_test0001", MODEL.name, MODEL.turn_detection_types)
        self.log: list[Record] = []
        self.clock = 1000

    def _batch(self, event_id=None) -> Batch:
        self.clock += 10
        return Batch(self.state, MODEL.capabilities, self.clock, event_id)

    def _keep(self, batch: Batch) -> None:
        assert [r.seq for r in batch.records] == list(
            range(len(self.log) + 1, len(self.log) + 1 + len(batch.records))
        )
        self.log.extend(batch.records)

    def send(self, event: ce.ClientEvent):
        self.clock += 10
        batch, effects = step(self.state, event, ModelFacts(MODEL), self.clock)
        self._keep(batch)
        return effects

    def chunk(self, text: str, ms: float = 100) -> None:
        batch = self._batch()
        emit_chunk(batch, self.state.response, ModelChunk(audio=tone_pcm16(ms), text=text))
        self._keep(batch)

    def finish(self) -> None:
        batch = self._batch()
        finish_response(batch, "completed")
        self._keep(batch)

    def refold(self) -> SessionState:
        return fold(
            self.log, initial_state("sess_test0001", MODEL.name, MODEL.turn_detection_types)
        )


def conversation() -> Script:
    script = Script()
    script.send(
        ce.SessionUpdateEvent(
            session=msgspec.convert(
                {"instructions": "hi", "input_audio_format": "g711_ulaw"}, ce.SessionUpdate
            )
        )
    )
    script.send(ce.InputAudioAppend(audio=b64(b"\xff" * 800), event_id="a1"))
    script.send(ce.InputTextAppend(text="one two"))
    effects = script.send(ce.InputAudioCommit())
    assert any(isinstance(e, StartAnswer) for e in effects)
    script.chunk("one")
    script.chunk(" two")
    script.finish()
    script.send(ce.PlaybackAck(played_ms=150))
    return script


def test_refold_equals_live_state():
    script = conversation()
    assert script.refold() == script.state
    assert script.state.turn_id == 1 and script.state.response is None
    item = script.state.items[-1]
    assert item.parts[0].transcript == "one two" and item.history_ms == 150.0
    assert item.marks == [(100.0, 3), (200.0, 7)]


def test_refold_is_independent_of_chunking():
    """Folding in one pass or record by record gives the same state."""
    script = conversation()
    stepwise = initial_state("sess_test0001", MODEL.name, MODEL.turn_detection_types)
    for record in script.log:
        fold([record], stepwise)
    assert stepwise == script.state


def test_a_diverging_state_is_detected():
    script = conversation()
    script.state.epoch += 1  # what an apply with hidden inputs would cause
    assert script.refold() != script.state


def test_rejected_command_adds_nothing():
    script = conversation()
    before = len(script.log)
    with pytest.raises(ProtocolError) as err:
        script.send(ce.InputAudioCommit())
    assert err.value.code == "input_audio_buffer_empty"
    assert len(script.log) == before


@pytest.mark.parametrize("padding", [0, 1, 2])
def test_a_video_frame_of_the_largest_size_is_kept_and_one_byte_more_refused(padding):
    """The size is judged before decoding only where the text alone proves it
    too large; at the boundary the decoded size decides, for every padding."""
    from duplex_server.sessions.core.commands import MAX_VIDEO_FRAME_BYTES

    largest = MAX_VIDEO_FRAME_BYTES - padding
    script = Script()
    script.send(ce.InputAudioAppend(audio=b64(tone_pcm16(20)), video_frames=[b64(b"v" * largest)]))
    assert [len(r.body.data) for r in script.log if r.kind == "frame"] == [largest]
    before = len(script.log)
    for size in (largest + 1 + padding, largest + 3, largest * 2):
        with pytest.raises(ProtocolError) as err:
            script.send(
                ce.InputAudioAppend(audio=b64(tone_pcm16(20)), video_frames=[b64(b"v" * size)])
            )
        assert (err.value.code, err.value.param) == ("payload_too_large", "video_frames.0")
    assert len(script.log) == before


def test_fold_has_no_hidden_inputs():
    """The same records fold to the same state twice, with time passing between."""
    script = conversation()
    assert script.refold() == script.refold()


def test_cancel_advances_epoch_and_closes_response():
    script = Script()
    script.send(ce.InputAudioAppend(audio=b64(tone_pcm16(300))))
    script.send(ce.InputAudioCommit())
    script.chunk("x")
    effects = script.send(ce.ResponseCancel())
    assert any(isinstance(e, StopAnswer) for e in effects) and script.state.epoch == 1
    assert script.state.last_response.status == "cancelled"
    assert script.state.last_response.reason == "client_cancelled"
    assert script.refold() == script.state


def test_server_restart_keeps_only_acknowledged_audio():
    """Even under commit_all_on_done, a crash-closed turn keeps only what acks covered."""
    script = Script()
    script.send(
        ce.SessionUpdateEvent(
            session=msgspec.convert(
                {"playback_commit_policy": "commit_all_on_done"}, ce.SessionUpdate
            )
        )
    )
    script.send(ce.InputAudioAppend(audio=b64(tone_pcm16(300))))
    script.send(ce.InputAudioCommit())
    script.chunk("one")
    script.chunk(" two")
    script.send(ce.PlaybackAck(played_ms=120))
    batch = script._batch()
    finish_response(batch, "incomplete", "server_restart")
    script._keep(batch)
    item = script.state.items[-1]
    assert item.history_ms == 120.0 and item.status == "incomplete"
    assert script.state.last_response.reason == "server_restart"
    assert script.refold() == script.state


def test_a_preparation_reaches_only_the_command_it_was_made_for():
    """What the runtime prepared travels with its own command: an append's
    refusal refuses that append, a commit's transcript is that commit's, and
    a preparation handed to another command is a runtime bug that raises
    rather than being dropped."""
    script = Script()
    facts = ModelFacts(MODEL)
    busy = ProtocolError("rate_limited", "the model is behind real time")
    append = ce.InputAudioAppend(audio=b64(tone_pcm16(100)), event_id="evt_a1")
    with pytest.raises(ProtocolError) as refused:
        step(script.state, append, facts, 2000, PreparedAppend(refused=busy))
    assert refused.value.code == "rate_limited" and refused.value.event_id == "evt_a1"
    assert script.state.input.chunks == []
    script.send(ce.InputAudioAppend(audio=b64(tone_pcm16(100))))
    batch, _ = step(script.state, ce.InputAudioCommit(), facts, 2010, HeardTurn("hello there"))
    (commit,) = [r.body for r in batch.records if isinstance(r.body, CommitBody)]
    assert commit.transcript == "hello there"
    with pytest.raises(TypeError, match="HeardTurn was prepared for a InputAudioAppend"):
        step(script.state, append, facts, 2020, HeardTurn("not an append's"))
    with pytest.raises(TypeError, match="PreparedAppend was prepared for a InputTextAppend"):
        step(script.state, ce.InputTextAppend(text="hi"), facts, 2030, PreparedAppend())


def test_a_key_press_is_told_as_openai_does_and_kept_as_a_user_item():
    script = Script()
    batch, _ = step(
        script.state, ce.InputDtmf(digit="#", event_id="evt_k"), ModelFacts(MODEL), 5000
    )
    sent = [msgspec.json.decode(payload) for _, payload in batch.outbound]
    assert sent[0] == {
        "type": "input_audio_buffer.dtmf_event_received",
        "event_id": sent[0]["event_id"],
        "server_event_seq": sent[0]["server_event_seq"],
        "event": "#",
        "received_at": 5,
    }
    assert [e["type"] for e in sent[1:]][-1] == "conversation.item.done"
    (item,) = script.state.items
    assert (item.role, item.parts[0].text) == ("user", "(the user pressed the # key)")
    script.log.extend(batch.records)
    assert script.refold() == script.state
