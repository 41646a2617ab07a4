"""The answer track: 20 ms frames on the loop's clock, acks when a delta's
last frame goes out, silence from the frame after a clear."""

from __future__ import annotations

import numpy as np
import pytest

from duplex_server.webrtc.tracks import FRAME_BYTES, FRAME_SAMPLES, AnswerTrack


def tone(ms: float, level: int = 1000) -> bytes:
    return np.full(int(24 * ms), level, dtype="<i2").tobytes()


def samples(frame) -> np.ndarray:
    return frame.to_ndarray().reshape(-1)


async def test_frames_are_20_ms_with_running_timestamps_and_silence_when_idle():
    track = AnswerTrack(lambda *_: None)
    first, second = await track.recv(), await track.recv()
    assert (first.samples, first.sample_rate, first.pts) == (FRAME_SAMPLES, 24_000, 0)
    assert second.pts == FRAME_SAMPLES
    assert not samples(first).any()


async def test_a_delta_is_acknowledged_when_its_last_frame_is_sent():
    acks: list[tuple[str, float]] = []
    track = AnswerTrack(lambda response, ms: acks.append((response, ms)))
    track.play(tone(50), "resp_1", 50.0)  # 2.5 frames: the half waits for more
    track.play(tone(30), "resp_1", 80.0)
    assert track.queued_ms == pytest.approx(80.0)
    for _ in range(2):
        await track.recv()
    assert acks == []  # 40 ms sent: the first delta ends at 50
    await track.recv()
    assert acks == [("resp_1", 50.0)]
    await track.recv()
    assert acks == [("resp_1", 50.0), ("resp_1", 80.0)]
    assert track.sent is not None and track.sent.ms == pytest.approx(80.0)


async def test_the_last_frame_of_an_answer_is_padded_and_counts_its_audio_only():
    acks: list[tuple[str, float]] = []
    track = AnswerTrack(lambda response, ms: acks.append((response, ms)))
    track.play(tone(30), "resp_1", 30.0)
    track.finish()
    await track.recv()
    last = await track.recv()
    assert (
        samples(last)[: FRAME_SAMPLES // 2].all() and not samples(last)[FRAME_SAMPLES // 2 :].any()
    )
    assert acks == [("resp_1", 30.0)] and track.sent.ms == pytest.approx(30.0)


async def test_a_clear_silences_the_next_frame_and_says_what_was_sent():
    acks: list[tuple[str, float]] = []
    track = AnswerTrack(lambda response, ms: acks.append((response, ms)))
    track.play(tone(200), "resp_1", 200.0)
    await track.recv()
    await track.recv()
    sent = track.clear()
    assert (sent.response_id, sent.ms) == ("resp_1", pytest.approx(40.0))
    assert not samples(await track.recv()).any()
    assert track.queued_ms == 0 and acks == []


async def test_a_new_answer_does_not_carry_the_last_ones_partial_frame():
    track = AnswerTrack(lambda *_: None)
    track.play(tone(10), "resp_1", 10.0)
    track.play(tone(20, level=2000), "resp_2", 20.0)
    first, second = await track.recv(), await track.recv()
    assert samples(first)[: FRAME_SAMPLES // 2].tolist() == [1000] * (FRAME_SAMPLES // 2)
    assert set(samples(second).tolist()) == {2000}
    assert FRAME_BYTES == FRAME_SAMPLES * 2


class FakeChannel:
    readyState = "open"

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.handlers: dict[str, object] = {}

    def on(self, name: str, handler) -> None:
        self.handlers[name] = handler

    def send(self, text: str) -> None:
        self.sent.append(text)


async def test_a_flooded_channel_queues_a_bounded_number_and_says_so():
    import json

    from duplex_server.webrtc.call import MAX_QUEUED_FRAMES, ChannelFrames

    frames, channel = ChannelFrames(max_frame_chars=100), FakeChannel()
    frames.attach(channel)  # type: ignore[arg-type]
    arrived = channel.handlers["message"]
    for i in range(MAX_QUEUED_FRAMES + 40):
        arrived(f'{{"type": "session.heartbeat", "event_id": "e{i}"}}')  # type: ignore[operator]
    arrived("x" * 101)  # type: ignore[operator]
    assert frames.dropped == 41
    codes = [json.loads(text)["error"]["code"] for text in channel.sent]
    # told at the 1st, 2nd, 4th, 8th, 16th and 32nd drop: a flood is not echoed
    assert codes == ["rate_limited"] * 6
    received = [await frames.receive() for _ in range(MAX_QUEUED_FRAMES)]
    assert (
        received[-1] == f'{{"type": "session.heartbeat", "event_id": "e{MAX_QUEUED_FRAMES - 1}"}}'
    )
    frames.end()
    assert await frames.receive() is None
