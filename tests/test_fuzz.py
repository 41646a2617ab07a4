"""Property-based fuzzing of client events (issue 16, part 5).

Frames come from ``duplex_bench.fuzz.FrameFuzzer``, which walks the
protocol's Structs; here its choices are hypothesis draws, so a failure
shrinks to a short sequence of small frames. Two layers:

- pure: each frame through the server's ``FrameDecoder`` and the session's
  ``step``, as the actor runs them: a frame is refused with a documented
  code or stepped; every event it journals is one the openai SDK's models
  (or our own structs) accept; a refused step leaves the state its log
  folds to; the records' seqs are contiguous; every record encodes as a
  durable store writes it; refold == live at the end, from the records and
  from their stored form.
- end to end: one real server (echo model, SQLite in a temp dir); each
  example is one session on one socket, checked after every batch (the
  heartbeat answers, every error is coded, every refused frame got its
  code) and at its end (the live session is the fold of its log, which is
  contiguous and holds each event the socket received exactly once).

``duplex-server bench fuzz`` runs the same generator for many more frames.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from duplex_bench.fuzz import FrameFuzzer, FuzzClient, Known, Tally
from duplex_server.models import build_model
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands import SOCKET_EVENTS, ModelFacts, PreparedAppend
from duplex_server.sessions.core.config import response_output_format, with_default_turn_detection
from duplex_server.sessions.core.model_port import ModelChunk
from duplex_server.sessions.core.pipeline import step
from duplex_server.sessions.core.records import ConfigBody, Record
from duplex_server.sessions.core.responses import emit_chunk, finish_response
from duplex_server.sessions.core.state import SessionState, fold, initial_state
from duplex_server.sessions.log.record_codec import (
    StoredRecord,
    decode_records,
    encode_records,
    record_decoder,
)
from duplex_server.sessions.runtime.codecs import SessionCodecs
from protocol import client_events as ce
from protocol.codec import FrameDecoder
from protocol.errors import ERROR_CLASS, ProtocolError, error_body
from protocol.server_events import Error
from protocol.session_config import SessionUpdate
from tests import openai_conformance
from tests.e2e.serverproc import ServerProcess
from tests.wsclient import tone_pcm16

MODEL = build_model("echo")
SESSION_ID = "sess_fuzz00000001"

# Reproducible in CI: the same examples every run, nothing written to disk.
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


class HypothesisSource:
    """The generator's choices as hypothesis draws (so failures shrink)."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def below(self, n: int) -> int:
        return self.data.draw(st.integers(0, n - 1))

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def real(self) -> float:
        return self.data.draw(st.floats())

    def text(self, max_size: int) -> str:
        return self.data.draw(st.text(max_size=max_size))


class PureSession:
    """A session driven as the actor drives it, without the actor: decode,
    step (a retried event id is refused there), journal refusals as error events, refold
    when a refused step had already added records."""

    def __init__(self) -> None:
        self.state = self._initial()
        self.log: list[Record] = []
        self.stored: list[StoredRecord] = []  # the log as a durable store writes it
        self.decoder = FrameDecoder()
        self.codecs = SessionCodecs()
        self.known = Known(session_ids=[SESSION_ID])
        self.clock = 1_000
        opening = self._batch()
        patch = with_default_turn_detection(SessionUpdate(), MODEL.turn_detection_types)
        opening.fact(ConfigBody(patch=patch), origin="manager")
        self._keep(opening)

    @staticmethod
    def _initial() -> SessionState:
        return initial_state(SESSION_ID, MODEL.name, MODEL.turn_detection_types)

    def refold(self) -> SessionState:
        return fold(self.log, self._initial())

    def refold_stored(self) -> SessionState:
        rows = [(record_decoder.decode(r.blob), r.payload, r.twin, r.audio) for r in self.stored]
        return fold(decode_records(SESSION_ID, rows), self._initial())

    def _batch(self, event_id: str | None = None) -> Batch:
        self.clock += 10
        return Batch(self.state, MODEL.capabilities, self.clock, event_id)

    def _keep(self, batch: Batch) -> None:
        first = len(self.log) + 1
        assert [r.seq for r in batch.records] == list(range(first, first + len(batch.records)))
        self.log.extend(batch.records)
        self.stored.extend(encode_records(batch.records, split_audio=True))
        for _, payload in batch.outbound:
            # what a client with both spellings (events=both) would get, as
            # the openai SDK's models and our own structs judge it
            violation = openai_conformance.check_event(payload.decode(), "both")
            assert violation is None, str(violation)
            self.known.learn(json.loads(payload))

    def _reject(self, err: ProtocolError) -> None:
        assert err.code in ERROR_CLASS, err.code
        batch = self._batch()
        batch.emit(Error(error=error_body(err)))
        self._keep(batch)

    def _prepared(self, event: ce.ClientEvent) -> PreparedAppend | None:
        if isinstance(event, ce.InputAudioAppend):
            return PreparedAppend(decode_stream=self.codecs.decode_opus)
        return None

    def feed(self, frame: str | bytes) -> str:
        """What became of ``frame``: its error code, "stepped", or why it never stepped."""
        try:
            event = self.decoder.decode(frame)
        except ProtocolError as err:
            self._reject(err)
            return err.code
        if isinstance(event, SOCKET_EVENTS):
            return "socket"  # answered by the socket layer, never a session step
        before = self.state.last_seq
        self.clock += 10
        try:
            batch, _ = step(self.state, event, ModelFacts(MODEL), self.clock, self._prepared(event))
        except ProtocolError as err:
            if self.state.last_seq != before:
                self.state = self.refold()  # as the actor does
            assert self.state == self.refold(), f"refused {err.code} left the state changed"
            self._reject(err)
            return err.code
        self._keep(batch)
        return "stepped"

    def model_output(self, what: int) -> None:
        """A chunk of the answer streaming (1) or its end (2), as the model would send."""
        response = self.state.response
        if response is None or what == 0:
            return
        batch = self._batch()
        if what == 1:
            fmt = response_output_format(response.overrides, self.state.config.output_format)
            chunk = ModelChunk(audio=tone_pcm16(40), text="echo ")
            emit_chunk(batch, response, chunk, self.codecs.stream_encoder(response.id, fmt))
        else:
            finish_response(batch, "completed")
        self._keep(batch)


@settings(FUZZ, max_examples=200)
@given(st.data())
def test_every_frame_is_refused_with_a_code_or_stepped(data):
    session = PureSession()
    source = HypothesisSource(data)
    fuzzer = FrameFuzzer(source, session.known)
    for _ in range(source.integer(1, 40)):
        frame = fuzzer.frame()
        note(f"frame {frame!r:.400}")
        outcome = session.feed(frame)
        note(f"  -> {outcome}")
        assert outcome in ERROR_CLASS or outcome in ("stepped", "socket", "retry")
        if session.state.closed_reason is not None:
            break  # the actor stops serving a closed session
        session.model_output(source.below(3))
    assert [r.seq for r in session.log] == list(range(1, len(session.log) + 1))
    assert session.refold() == session.state
    assert session.refold_stored() == session.state


# --- against a real server --------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    store = tmp_path_factory.mktemp("fuzz") / "sessions.db"
    server = ServerProcess(f"sqlite:{store}").start()
    try:
        yield server
    finally:
        server.stop()


@settings(FUZZ, max_examples=30)
@given(data=st.data())
def test_a_real_server_answers_every_frame_and_keeps_its_log(fuzz_server, data):
    tally = Tally()
    client = FuzzClient(fuzz_server.ws_url, fuzz_server.http_url, tally)
    fuzzer = FrameFuzzer(HypothesisSource(data))
    frames = data.draw(st.integers(1, 40))
    openai_conformance.violations.clear()  # any left are an earlier example's, failed already
    asyncio.run(client.session(fuzzer, frames, batch=10))
    note(f"errors by code: {dict(tally.errors_by_code)}; ended by {dict(tally.ended_by)}")
    found = [str(violation) for violation in openai_conformance.violations]
    assert not found, "\n".join(found[:3])
    assert tally.sessions == 1
    assert not tally.faults, "\n".join(tally.faults + [str(r) for r in tally.reproducers])
    assert tally.heartbeat_failures == 0


# Frames fuzzing found breaking a session, kept as regressions.
FOUND = [
    # A tool's JSON Schema is stored verbatim: a number beyond int64 made the
    # SQLite append raise OverflowError and the actor end the session (1011).
    pytest.param(
        '{"type":"session.update","session":{"tools":[{"parameters":{"n":-9223372036854775809}}]}}',
        id="int-beyond-int64-in-a-tool-schema",
    ),
    pytest.param(
        '{"type":"session.update","session":{"max_output_tokens":18446744073709551616}}',
        id="int-beyond-uint64-max-output-tokens",
    ),
    pytest.param(
        '{"type":"session.update","session":{"extra_body":{"force_listen_count":18446744073709551616}}}',
        id="int-beyond-uint64-force-listen-count",
    ),
    # The typed decoder skips an unknown key unread, invalid UTF-8 and all:
    # naming the field by decoding again must not raise.
    pytest.param(
        b'{"type":"session.update","x":"\xff","session":{"max_output_tokens":18446744073709551616}}',
        id="int-beyond-uint64-beside-invalid-utf8",
    ),
    # Accepted and echoed in events that fail the openai SDK's models (a
    # stock client stops parsing there): content parts whose type did not
    # fit the role, in conversation.item.added/created/done ...
    pytest.param(
        '{"type":"conversation.item.create","item":{"type":"message","role":"user",'
        '"content":[{"type":"text","text":"hi"}]}}',
        id="user-item-with-beta-text-part",
    ),
    pytest.param(
        '{"type":"conversation.item.create","item":{"type":"message","role":"assistant",'
        '"content":[{"type":"input_text","text":"hi"}]}}',
        id="assistant-item-with-input-text-part",
    ),
    pytest.param(
        '{"type":"conversation.item.create","item":{"type":"message","role":"user",'
        '"content":[{"type":"x"}]}}',
        id="item-with-unknown-part-type",
    ),
    # ... and a tool_choice or a tool type OpenAI does not have, in session.updated.
    pytest.param('{"type":"session.update","session":{"tool_choice":""}}', id="tool-choice-empty"),
    pytest.param(
        '{"type":"session.update","session":{"tools":[{"type":"x","name":"f"}]}}',
        id="tool-of-unknown-type",
    ),
]


@pytest.mark.parametrize("frame", FOUND)
def test_frames_fuzzing_found_are_refused_or_served(frame):
    session = PureSession()
    outcome = session.feed(frame)  # checks every event it journals
    assert outcome in ERROR_CLASS or outcome == "stepped"
    assert session.refold_stored() == session.state
