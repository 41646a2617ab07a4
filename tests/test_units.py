"""The unit framer of the streaming port (core.units): pure, no clock."""

from __future__ import annotations

from duplex_server.sessions.core.units import UnitFramer

RATE = 24_000
UNIT = RATE * 80 // 1000 * 2  # bytes of one 80 ms unit


def test_units_are_whole_and_numbered_across_appends():
    framer = UnitFramer(RATE, 80)
    assert framer.push(b"\x01\x00" * 1000) == []  # 1000 samples: less than a unit
    units = framer.push(b"\x01\x00" * 3000)  # 4000 samples: two units of 1920, 160 left
    assert [u.index for u in units] == [0, 1]
    assert all(len(u.pcm) == UNIT and not u.silence for u in units)
    assert framer.pending_bytes == (4000 - 2 * 1920) * 2
    assert [u.index for u in framer.push(b"\x01\x00" * 1920)] == [2]


def test_a_pause_completes_the_pending_unit_then_clocks_silence():
    framer = UnitFramer(RATE, 80)
    framer.push(b"\x05\x00" * 100)
    first = framer.silence()
    assert first.index == 0 and not first.silence  # it carries the 100 samples heard
    assert first.pcm[:200] == b"\x05\x00" * 100 and first.pcm[200:] == bytes(UNIT - 200)
    second = framer.silence()
    assert (second.index, second.silence, second.pcm) == (1, True, bytes(UNIT))
    assert framer.push(b"\x00\x00" * 1920)[0].index == 2  # the timeline went on
