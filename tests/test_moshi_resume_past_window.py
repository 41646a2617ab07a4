"""A ``--model moshi:PATH`` session resumed after its call outgrew the
temporal window: a tiny random checkpoint whose window is 3 frames, a
session sampled at 0.8 and primed with a persona, stepped 16 units (five
windows), then reopened under the same id from what a restore keeps of its
log (the latest ``resume_units`` units, as ``UnitFeed.restore`` keeps
them) at units 7 and 11, past the wrap. Each reopened session continues
the uninterrupted one's tokens frame for frame, and its voice. A window's
worth of units alone would not: its keys and values came from frames
further back, and each frame's noise is drawn at its frame number."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from duplex_bench.tiny_moshi import FRAME_SAMPLES, tiny_moshi
from duplex_server.models import build_model
from duplex_server.sessions.core.model_port import InputUnit, SteppedUnit, StreamSetup

WINDOW = 3
UNITS = 16
SETUP = StreamSetup(instructions="a kind pirate", temperature=0.8)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    checkpoint = tiny_moshi(tmp_path_factory.mktemp("moshi-past-window"), window=WINDOW)
    built = build_model(f"moshi:{checkpoint}", device="cpu", dtype="float32", moshi_rows=2)
    assert built.service.wait_loaded(120), built.service.load_error
    assert built.service.checkpoint.window == WINDOW
    yield built
    built.service.close()


def feed() -> list[InputUnit]:
    noise = np.random.default_rng(3).standard_normal((UNITS, FRAME_SAMPLES)) * 3000
    return [InputUnit(i, noise[i].astype("<i2").tobytes(), 24_000) for i in range(UNITS)]


async def steps(session, units: list[InputUnit]):
    try:
        return [(await session.step(unit))[0] for unit in units]
    finally:
        session.close()


@pytest.fixture(scope="module")
def uninterrupted(model):
    return asyncio.run(steps(model.streaming.open("call", SETUP), feed()))


@pytest.mark.parametrize("logged", [2 * WINDOW + 1, 3 * WINDOW + 2])
async def test_a_session_resumed_past_the_window_continues_the_uninterrupted_call(
    model, uninterrupted, logged
):
    units = feed()
    stepped = [SteppedUnit(units[i], uninterrupted[i].tokens) for i in range(logged)]
    kept = stepped[-model.streaming.resume_units :]  # what a restore hands the model
    assert len(kept) == logged > WINDOW
    continued = await steps(model.streaming.open("call", SETUP, kept), units[logged:])
    assert [o.tokens for o in continued] == [o.tokens for o in uninterrupted[logged:]]
    # the voice of every frame both sent (the floor, the session's own state
    # and not the model's, starts afresh: the first decisions may differ)
    voiced = [
        (mine.audio, theirs.audio)
        for mine, theirs in zip(continued, uninterrupted[logged:], strict=True)
        if mine.audio and theirs.audio
    ]
    assert voiced  # it speaks on after the resume
    for mine, theirs in voiced:
        got = np.frombuffer(mine, "<i2").astype(np.int32)
        expected = np.frombuffer(theirs, "<i2").astype(np.int32)
        assert np.abs(got - expected).max() <= 1  # float32 rounding of a rebuild


async def test_the_last_window_alone_does_not_continue_the_call(model, uninterrupted):
    """Why the whole call is kept: a rebuild from the last window's units
    continues something else."""
    units, logged = feed(), 2 * WINDOW + 1
    stepped = [SteppedUnit(units[i], uninterrupted[i].tokens) for i in range(logged)]
    continued = await steps(model.streaming.open("call", SETUP, stepped[-WINDOW:]), units[logged:])
    assert [o.tokens for o in continued] != [o.tokens for o in uninterrupted[logged:]]
