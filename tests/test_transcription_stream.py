"""POST /v1/audio/transcriptions streamed (``stream=true``: OpenAI's
``transcript.text.delta`` / ``transcript.text.done`` events) and timed
(``verbose_json`` with ``timestamp_granularities``: segments and words),
through the stock openai SDK against a real server with the default
recogniser (Whisper on CTranslate2), on people's recorded speech."""

from __future__ import annotations

import re
import threading

import openai
import pytest

from duplex_bench import recorded_speech
from duplex_server.audio.containers import encode
from duplex_server.sessions.core import records as r
from tests.batch_helpers import batch_server, client
from tests.speech import silence

RATE = recorded_speech.SAMPLE_RATE_HZ
FORWARD = ["go", "forward", "10", "meters"]  # what Whisper tiny.en hears of go_forward
HIMSELF = ["he", "might", "even", "have", "been", "made", "amiable", "himself"]


def words(text: str) -> list[str]:
    """Lower-case words and numbers ("Go forward 10 meters." is go, forward, 10, meters)."""
    return re.findall(r"[\w']+", text.lower())


@pytest.fixture(scope="module")
def recordings() -> dict[str, bytes]:
    utterances = recorded_speech.load(recorded_speech.ensure(recorded_speech.default_dir()))
    return {u.name: u.pcm16 for u in utterances}


def joined(recordings: dict[str, bytes], *names: str, pause_ms: int = 1000) -> bytes:
    """The recordings one after another, a pause of silence around each."""
    pcm = silence(pause_ms, RATE)
    for name in names:
        pcm += recordings[name] + silence(pause_ms, RATE)
    return pcm


@pytest.fixture
async def server(tmp_path):
    async with batch_server(f"sqlite:{tmp_path / 's.db'}", asr="auto") as running:
        yield running


def wav(pcm: bytes) -> tuple[str, bytes]:
    return ("speech.wav", encode(pcm, "wav", RATE))


async def test_streamed_deltas_add_up_to_the_text_and_a_retry_replays_them(server, recordings):
    pcm = joined(recordings, recorded_speech.READING, "cold_hearted", "amiable_himself")
    sdk = client(server)
    asr = server.app.state.batch.audio.transcriber
    headers = {"Idempotency-Key": "stream-1"}
    stream = await sdk.audio.transcriptions.create(
        model="gpt-4o-transcribe", file=wav(pcm), stream=True, extra_headers=headers
    )
    events = [event async for event in stream]
    *deltas, done = events
    assert [e.type for e in deltas] == ["transcript.text.delta"] * len(deltas)
    assert done.type == "transcript.text.done"
    assert len(deltas) >= 3  # one a stretch between pauses, at least one a recording
    assert "".join(d.delta for d in deltas) == done.text
    heard = words(done.text)
    for word in ("dashwood", "leisure", "selfish", "amiable", "himself"):
        assert word in heard
    whole = await sdk.audio.transcriptions.create(model="whisper-1", file=wav(pcm))
    assert whole.text == done.text  # the same stretches, the same words
    runs = asr.runs
    again = await sdk.audio.transcriptions.create(
        model="gpt-4o-transcribe", file=wav(pcm), stream=True, extra_headers=headers
    )
    assert [e.model_dump() async for e in again] == [e.model_dump() for e in events]
    assert asr.runs == runs  # replayed from the log, nothing heard again


async def test_each_stretch_is_sent_as_soon_as_it_is_heard(server, recordings, monkeypatch):
    """The second stretch's decode is held until the first delta has reached
    the client, so the delta cannot have waited for the whole recording."""
    pcm = joined(recordings, "go_forward", "amiable_himself")
    recogniser = server.app.state.batch.audio.transcriber._stages.asr
    heard_once, release = threading.Event(), threading.Event()
    waited_out: list[bool] = []
    transcribe = recogniser.transcribe

    def held(*args):
        if heard_once.is_set():
            # A guard against hanging the suite, not a time limit: a server
            # that held the first delta back would wait it out, and fail below.
            waited_out.append(not release.wait(120))
        heard_once.set()
        return transcribe(*args)

    monkeypatch.setattr(recogniser, "transcribe", held)
    try:
        stream = await client(server).audio.transcriptions.create(
            model="whisper-1", file=wav(pcm), stream=True
        )
        first = await stream.__anext__()
        assert not release.is_set() and not waited_out
    finally:
        release.set()
    assert first.type == "transcript.text.delta"
    assert words(first.delta) == FORWARD
    *rest, done = [event async for event in stream]
    assert waited_out == [False]  # the second stretch waited for the first delta, no longer
    assert words(done.text) == FORWARD + HIMSELF
    assert first.delta + "".join(e.delta for e in rest) == done.text


async def test_words_have_monotonic_times_inside_the_audio_and_their_stretch(server, recordings):
    pcm = joined(recordings, "go_forward", "amiable_himself", recorded_speech.READING)
    result = await client(server).audio.transcriptions.create(
        model="whisper-1",
        file=wav(pcm),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
        language="en",
    )
    duration = len(pcm) / 2 / RATE
    timed = result.words or []
    assert [words(w.word) for w in timed] == [[word] for word in words(result.text)]
    for word, after in zip(timed, timed[1:], strict=False):
        assert word.end <= after.start
    for word in timed:
        assert 0 <= word.start <= word.end <= duration
    segments = result.segments or []
    assert [words(s.text) for s in segments][:2] == [FORWARD, HIMSELF]
    by_segment = [[w for w in timed if s.start <= w.start and w.end <= s.end] for s in segments]
    assert [[w.word.lower() for w in found] for found in by_segment[:2]] == [FORWARD, HIMSELF]
    assert sum(len(found) for found in by_segment) == len(timed)
    # The times are where the words are said, not bunched at a stretch's edge:
    # each stretch's words run to its end, and a word lasts as long as a word.
    for segment, found in zip(segments, by_segment, strict=True):
        assert segment.end - found[-1].end < 0.6
    lengths = sorted(w.end - w.start for w in timed)
    assert 0.15 < lengths[len(lengths) // 2] < 0.6
    # The second of silence between the recordings holds no word.
    assert by_segment[1][0].start - by_segment[0][-1].end > 0.5


async def test_word_granularity_alone_gives_words_and_no_segments(server, recordings):
    result = await client(server).audio.transcriptions.create(
        model="whisper-1",
        file=wav(joined(recordings, "go_forward")),
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    assert result.segments is None
    assert [w.word.lower() for w in result.words or []] == FORWARD


async def test_subtitle_cues_are_the_segments_times(server, recordings):
    sdk = client(server)
    file = wav(joined(recordings, "go_forward", "amiable_himself", "seven_of_clubs"))
    verbose = await sdk.audio.transcriptions.create(
        model="whisper-1", file=file, response_format="verbose_json"
    )
    srt = await sdk.audio.transcriptions.create(model="whisper-1", file=file, response_format="srt")
    vtt = await sdk.audio.transcriptions.create(model="whisper-1", file=file, response_format="vtt")

    def ms(stamp: str) -> int:
        h, m, s, frac = re.split(r"[:,.]", stamp)
        return ((int(h) * 60 + int(m)) * 60 + int(s)) * 1000 + int(frac)

    expected = [(round(s.start * 1000), round(s.end * 1000)) for s in verbose.segments or []]
    assert len(expected) == 3
    for subtitles in (srt, vtt):
        cues = re.findall(r"(\S+) --> (\S+)", subtitles)
        assert [(ms(a), ms(b)) for a, b in cues] == expected


STREAM_BAD = [
    ({"stream": True, "response_format": "verbose_json"}, "unsupported_value", "response_format"),
    ({"stream": True, "response_format": "srt"}, "unsupported_value", "response_format"),
    ({"timestamp_granularities": ["word"]}, "invalid_value", "timestamp_granularities"),
    ({"timestamp_granularities": ["word"], "response_format": "json"}, "invalid_value",
     "timestamp_granularities"),
    ({"timestamp_granularities": ["sentence"], "response_format": "verbose_json"},
     "invalid_value", "timestamp_granularities"),
    ({"extra_body": {"stream": "maybe"}}, "invalid_type", "stream"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "code", "param"), STREAM_BAD)
async def test_timed_and_streamed_requests_it_cannot_serve_are_refused(
    server, recordings, change, code, param
):
    sdk = client(server)
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.audio.transcriptions.create(
            model="whisper-1", file=wav(joined(recordings, "go_forward")), **change
        )
    error = refused.value.body
    assert (error["code"], error["param"]) == (code, param)
    assert not [s for s in await server.app.state.log.sessions() if r.is_job_session(s.session_id)]


async def test_pocketsphinx_gives_no_word_times_but_streams(tmp_path, recordings):
    async with batch_server("memory", blob_dir=str(tmp_path / "b"), asr="pocketsphinx") as server:
        sdk = client(server)
        file = wav(joined(recordings, "go_forward"))
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.audio.transcriptions.create(
                model="whisper-1",
                file=file,
                response_format="verbose_json",
                timestamp_granularities=["word"],
            )
        error = refused.value.body
        assert (error["code"], error["param"]) == (
            "unsupported_value",
            "timestamp_granularities",
        )
        stream = await sdk.audio.transcriptions.create(model="whisper-1", file=file, stream=True)
        *deltas, done = [event async for event in stream]
        assert done.type == "transcript.text.done" and done.text
        assert "".join(d.delta for d in deltas) == done.text
