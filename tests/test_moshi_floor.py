"""The moshi floor, read off the model's own output frame by frame: a word
takes the floor, QUIET_FRAMES frames without one give it back, the model's
quiet under the user's speech is its yield, and after a fence it waits to
be quiet before it may take the floor again."""

from __future__ import annotations

from duplex_server.models.moshi.floor import QUIET_FRAMES, YIELD_FRAMES, Floor


def run(floor: Floor, frames: list[tuple[bool, bool]]) -> list[str | None]:
    return [floor.update(voiced, talking) for voiced, talking in frames]


def test_a_word_takes_the_floor_and_quiet_gives_it_back():
    floor = Floor()
    decisions = run(floor, [(False, False), (True, False), (False, False), (True, False)])
    assert decisions == ["listen", "speak", None, None]  # a pause between words holds it
    quiet = run(floor, [(False, False)] * QUIET_FRAMES)
    assert quiet == [None] * (QUIET_FRAMES - 1) + ["end_of_turn"]
    assert run(floor, [(False, False)]) == ["listen"]


def test_quiet_under_the_users_speech_is_a_yield():
    floor = Floor()
    run(floor, [(True, False)])
    # the user talking while the model still says words is overlap, not a yield
    assert run(floor, [(True, True)] * 4) == [None] * 4
    decisions = run(floor, [(False, True)] * YIELD_FRAMES)
    assert decisions == [None] * (YIELD_FRAMES - 1) + ["yield"]


def test_after_a_fence_it_must_fall_quiet_before_it_speaks_again():
    floor = Floor()
    run(floor, [(True, False)])
    floor.interrupt()
    # it goes on talking in its own stream: none of it takes the floor
    assert run(floor, [(True, False)] * 5) == ["listen"] * 5
    assert run(floor, [(False, False)] * YIELD_FRAMES) == ["listen"] * YIELD_FRAMES
    assert run(floor, [(True, False)]) == ["speak"]
