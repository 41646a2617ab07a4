"""The one model feed the actor drives: which feed a model gets, the
turn-model adapter's contract (recent turns handed over with each request,
output as unit outputs with one notice per burst, failures and stops), and
when a primed streaming model is opened."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from duplex_server.models import build_model
from duplex_server.sessions.core.model_port import (
    HistoryItem,
    InputUnit,
    ModelChunk,
    ResponseRequest,
    SessionView,
    SteppedUnit,
    StreamSetup,
    UnitOutput,
)
from duplex_server.sessions.core.records import UnitBody
from duplex_server.sessions.runtime import mailbox as mb
from duplex_server.sessions.runtime.model_feed import open_feed
from duplex_server.sessions.runtime.turn_feed import RECENT_TURNS, TurnFeed
from duplex_server.sessions.runtime.unit_feed import UnitFeed

VIEW = SessionView(
    instructions="",
    voice="alloy",
    speed=1.0,
    temperature=0.8,
    max_output_tokens="inf",
    tools=[],
    tool_choice="auto",
    chunk_delay_ms=0.0,
)


def request(response_id: str = "resp_1") -> ResponseRequest:
    return ResponseRequest(
        session_id="sess_feed0001",
        response_id=response_id,
        epoch=3,
        modalities=["audio", "text"],
        history=[],
        config=VIEW,
    )


class Recorder:
    """A turn model that says what it is told to, and remembers requests."""

    def __init__(self, chunks: list[ModelChunk], fail: bool = False, hang: bool = False) -> None:
        self.chunks, self.fail, self.hang = chunks, fail, hang
        self.requests: list[ResponseRequest] = []
        self.aborted: list[str] = []

    def wants_to_speak(self, history: list[HistoryItem], config: SessionView) -> bool:
        return True

    async def stream(self, request: ResponseRequest) -> AsyncIterator[ModelChunk]:
        self.requests.append(request)
        for chunk in self.chunks:
            yield chunk
        if self.fail:
            raise RuntimeError("model fell over")
        if self.hang:
            await asyncio.Event().wait()

    def abort(self, response_id: str) -> None:
        self.aborted.append(response_id)


async def settle(posted: list[object]) -> None:
    for _ in range(20):
        if posted and isinstance(posted[-1], mb.StreamEnd):
            return
        await asyncio.sleep(0.01)


def test_each_model_gets_the_feed_for_its_port():
    def post(message: object) -> None:
        pass

    assert isinstance(open_feed(build_model("echo"), "s", post, lambda: 0), TurnFeed)
    assert isinstance(open_feed(build_model("scripted"), "s", post, lambda: 0), UnitFeed)


def test_a_model_takes_input_exactly_one_way():
    class Mute:
        name = "mute"
        streaming = None
        answering = None

    with pytest.raises(ValueError, match="neither by unit nor by turn"):
        open_feed(Mute(), "s", lambda message: None, lambda: 0)  # type: ignore[arg-type]

    class Both:
        name = "both"
        streaming = build_model("scripted")
        answering = build_model("echo")

    with pytest.raises(ValueError, match="both ports"):
        open_feed(Both(), "s", lambda message: None, lambda: 0)  # type: ignore[arg-type]


async def test_the_adapter_hands_over_recent_turns_and_returns_unit_outputs():
    posted: list[object] = []
    model = Recorder([ModelChunk(audio=b"\x01\x00" * 4, text="hi"), ModelChunk(text=" there")])
    feed = TurnFeed(model, posted.append)
    for index in range(RECENT_TURNS + 2):
        feed.keep_turn(f"item_{index}", bytes([index]) * 2)
    feed.feed(b"\x00" * 100, 24_000)  # a turn model hears the commit, not the units
    feed.answer(request())
    await settle(posted)
    handed = model.requests[0].audio
    assert list(handed) == [f"item_{index}" for index in range(2, RECENT_TURNS + 2)]
    # one notice for the burst, then the end
    assert posted == [mb.Chunks("resp_1", 3), mb.StreamEnd("resp_1", 3, None)]
    assert feed.take("resp_1") == [
        UnitOutput(audio=b"\x01\x00" * 4, sample_rate_hz=24_000, text="hi"),
        UnitOutput(text=" there"),
    ]
    assert feed.take("resp_1") == []


async def test_a_turn_models_tool_call_passes_through_the_adapter():
    from duplex_server.sessions.core.model_port import FunctionCallPart

    posted: list[object] = []
    call = FunctionCallPart(call_id="call_1", name="lookup", arguments="{}")
    feed = TurnFeed(Recorder([ModelChunk(function_call=call)]), posted.append)
    feed.answer(request())
    await settle(posted)
    assert feed.take("resp_1") == [UnitOutput(function_call=call)]


async def test_a_failing_model_ends_its_answer_with_the_reason():
    posted: list[object] = []
    feed = TurnFeed(Recorder([ModelChunk(text="a")], fail=True), posted.append)
    feed.answer(request())
    await settle(posted)
    end = posted[-1]
    assert isinstance(end, mb.StreamEnd) and end.error == "RuntimeError: model fell over"


async def test_a_stopped_answer_is_aborted_and_says_nothing_more():
    posted: list[object] = []
    model = Recorder([ModelChunk(text="a")], hang=True)
    feed = TurnFeed(model, posted.append)
    feed.answer(request())
    for _ in range(20):
        if posted:
            break
        await asyncio.sleep(0.01)
    feed.stop("resp_1")
    await asyncio.sleep(0.02)
    assert model.aborted == ["resp_1"]
    assert feed.take("resp_1") == []
    assert not any(isinstance(message, mb.StreamEnd) for message in posted)


def test_model_audio_is_encoded_in_bounded_pieces():
    from duplex_server.sessions.core.model_port import FunctionCallPart
    from duplex_server.sessions.runtime.output_pieces import MAX_OUTPUT_PIECE_MS, bounded

    rate = 24_000
    audio = bytes(range(256)) * (rate * 5 // 256)  # 2.5 s of pcm16
    call = FunctionCallPart(call_id="c", name="n", arguments="{}")
    ending = UnitOutput(
        decision="end_of_turn", audio=audio, sample_rate_hz=rate, text="hi", function_call=call
    )
    pieces = bounded(ending)
    assert b"".join(p.audio for p in pieces) == audio
    assert all(len(p.audio) <= rate * MAX_OUTPUT_PIECE_MS // 1000 * 2 for p in pieces)
    assert [p.text for p in pieces] == ["hi", "", ""]
    assert [p.decision for p in pieces] == [None, None, "end_of_turn"]
    assert [p.function_call for p in pieces] == [None, None, call]
    speaking = bounded(UnitOutput(decision="speak", audio=audio, sample_rate_hz=rate))
    assert [p.decision for p in speaking] == ["speak", None, None]
    small = UnitOutput(audio=b"\x00\x00" * 10)
    assert bounded(small) == [small]


class Counter:
    """A streaming model whose tokens for a unit are its index and its first sample,
    and which remembers the history each stream was opened with."""

    sample_rate_hz = 8_000
    unit_ms = 20
    resume_units = 3
    primes_at_input = False

    def __init__(self) -> None:
        self.histories: list[list[SteppedUnit]] = []

    def open(self, session_id: str, setup: StreamSetup, history=()) -> Counter:
        self.histories.append(list(history))
        return self

    async def step(self, unit: InputUnit) -> list[UnitOutput]:
        return [UnitOutput(decision="listen", tokens=(unit.index, unit.pcm[0]))]

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


class Primed:
    """A streaming model primed at the session's first input: records what
    it was opened with and the units it heard."""

    sample_rate_hz = 24_000
    unit_ms = 80
    primes_at_input = True
    resume_units = 0

    def __init__(self) -> None:
        self.opened: list[StreamSetup] = []
        self.units: list[InputUnit] = []

    def open(self, session_id: str, setup: StreamSetup, history=()) -> Primed:
        self.opened.append(setup)
        return self

    async def step(self, unit: InputUnit) -> list[UnitOutput]:
        self.units.append(unit)
        return []

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


async def test_stepped_units_go_to_the_log_and_a_restore_hands_back_the_latest():
    model = Counter()
    posted: list[mb.UnitOutputs] = []
    feed = UnitFeed(model, "sess_units01", posted.append, lambda: 7)
    feed.start()
    unit_bytes = 2 * 8_000 * 20 // 1000
    feed.feed(bytes([5]) * unit_bytes * 2, 8_000)
    while len(posted) < 2:
        await asyncio.sleep(0.01)
    await feed.close()
    logged = [message.unit for message in posted[:2]]  # (a clocked pause may follow)
    assert [(u.index, u.tokens, u.pcm[:1], u.silence) for u in logged] == [
        (0, [0, 5], b"\x05", False),
        (1, [1, 5], b"\x05", False),
    ]
    assert all(message.epoch == 7 for message in posted[:2])

    # A restored session: the model gets the latest resume_units units, and
    # new units are numbered after the last logged one.
    silent = UnitBody(index=2, tokens=[2, 0], silence=True)
    del posted[2:]
    restored = UnitFeed(model, "sess_units01", posted.append, lambda: 7)
    restored.restore([*logged, silent, UnitBody(index=3, tokens=[3, 9], pcm=b"\x09" * unit_bytes)])
    restored.start()
    history = model.histories[-1]
    assert [(s.unit.index, s.tokens, s.unit.silence) for s in history] == [
        (1, (1, 5), False),
        (2, (2, 0), True),
        (3, (3, 9), False),
    ]
    assert history[1].unit.pcm == bytes(unit_bytes)  # a silence unit is heard as zeros
    restored.feed(bytes([4]) * unit_bytes, 8_000)
    while len(posted) < 3:
        await asyncio.sleep(0.01)
    await restored.close()
    first_new = posted[2].unit
    assert first_new is not None and first_new.index == 4


async def test_a_primed_model_opens_at_the_first_input_with_the_setup_then():
    """Before any input nothing is opened and no silence is clocked; the
    first audio opens the stream with the session's setup as it stands."""
    model = Primed()
    setup: list[StreamSetup | None] = [None]
    feed = UnitFeed(model, "sess_primed01", lambda message: None, lambda: 0, lambda: setup[0])
    feed.start()
    await asyncio.sleep(0.3)  # several unit periods: a clock would have fed silence
    assert model.opened == [] and model.units == []
    setup[0] = StreamSetup(instructions="be kind", voice="pirate")
    feed.feed(b"\x10\x00" * 1920, 24_000)
    while not model.units:  # stepped on the feed's own task
        await asyncio.sleep(0.01)
    await feed.close()
    assert model.opened == [StreamSetup(instructions="be kind", voice="pirate")]
    assert model.units[0].index == 0 and not model.units[0].silence


async def test_a_restored_session_with_input_opens_its_primed_model_at_once():
    model = Primed()
    setup = StreamSetup(instructions="be kind")
    feed = UnitFeed(model, "sess_primed02", lambda message: None, lambda: 0, lambda: setup)
    feed.start()
    await feed.close()
    assert model.opened == [setup]


class Paced:
    """A turn model whose chunks come when the test hands them over (None ends it)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[ModelChunk | None] = asyncio.Queue()
        self.aborted: list[str] = []

    def wants_to_speak(self, history: list[HistoryItem], config: SessionView) -> bool:
        return True

    async def stream(self, request: ResponseRequest) -> AsyncIterator[ModelChunk]:
        while (chunk := await self.queue.get()) is not None:
            yield chunk

    def abort(self, response_id: str) -> None:
        self.aborted.append(response_id)

    async def say(self, *chunks: ModelChunk | None) -> None:
        """Hand the chunks over and let the feed's pump take them all."""
        for chunk in chunks:
            self.queue.put_nowait(chunk)
        while not self.queue.empty():
            await asyncio.sleep(0)
        await asyncio.sleep(0)


async def past_the_first_delta(interval_s: float) -> tuple[Paced, TurnFeed, list[object]]:
    """A feed answering with ``interval_s``, its first text already taken."""
    posted: list[object] = []
    model = Paced()
    feed = TurnFeed(model, posted.append, text_delta_interval_s=interval_s)
    feed.answer(request())
    await model.say(ModelChunk(text="a"))
    assert feed.take("resp_1") == [UnitOutput(text="a")]
    return model, feed, posted


def notices(posted: list[object]) -> list[object]:
    return [message for message in posted if isinstance(message, mb.Chunks)]


async def test_text_after_the_first_delta_gathers_and_the_end_releases_it():
    posted: list[object] = []
    model = Paced()
    feed = TurnFeed(model, posted.append, text_delta_interval_s=3600.0)
    feed.answer(request())
    await model.say(ModelChunk(text="a"))
    assert posted == [mb.Chunks("resp_1", 3)]  # the first text goes at once
    assert feed.take("resp_1") == [UnitOutput(text="a")]
    await model.say(ModelChunk(text="b"), ModelChunk(text="c"), ModelChunk(text="d"))
    assert len(notices(posted)) == 1  # held: no notice per token
    await model.say(None)
    await settle(posted)
    # the end posts the held notice before itself: nothing is lost or reordered
    assert posted[1:] == [mb.Chunks("resp_1", 3), mb.StreamEnd("resp_1", 3, None)]
    assert feed.take("resp_1") == [UnitOutput(text="bcd")]


async def test_held_text_is_released_after_the_interval():
    model, feed, posted = await past_the_first_delta(0.01)
    await model.say(ModelChunk(text="b"), ModelChunk(text="c"))
    while len(notices(posted)) < 2:  # the timer's notice, whenever the loop gets to it
        await asyncio.sleep(0.005)
    assert feed.take("resp_1") == [UnitOutput(text="bc")]
    feed.stop("resp_1")


async def test_audio_and_tool_calls_never_wait_behind_the_interval():
    from duplex_server.sessions.core.model_port import FunctionCallPart

    model, feed, posted = await past_the_first_delta(3600.0)
    await model.say(ModelChunk(audio=b"\x01\x00" * 4, text="b"))
    assert len(notices(posted)) == 2
    feed.take("resp_1")
    call = FunctionCallPart(call_id="call_1", name="lookup", arguments="{}")
    await model.say(ModelChunk(function_call=call))
    assert len(notices(posted)) == 3
    assert feed.take("resp_1") == [UnitOutput(function_call=call)]
    feed.stop("resp_1")


async def test_a_stop_drops_held_text_and_its_notice():
    model, feed, posted = await past_the_first_delta(0.01)
    await model.say(ModelChunk(text="b"))
    feed.stop("resp_1")
    await asyncio.sleep(0.05)  # past the interval: a notice left armed would have come
    assert model.aborted == ["resp_1"]
    assert notices(posted) == [mb.Chunks("resp_1", 3)]
    assert feed.take("resp_1") == []


async def test_with_no_interval_each_token_is_posted_as_it_comes():
    posted: list[object] = []
    model = Paced()
    feed = TurnFeed(model, posted.append)
    feed.answer(request())
    for text in "abc":
        await model.say(ModelChunk(text=text))
        assert feed.take("resp_1") == [UnitOutput(text=text)]
    assert len(notices(posted)) == 3
    feed.stop("resp_1")
