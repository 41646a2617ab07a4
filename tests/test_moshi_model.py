"""``--model moshi:PATH`` through the model registry, as ``serve`` builds it:
a tiny random checkpoint loads on the engine's thread, sessions step units
on the streaming port batched into one tick, a session is primed with its
persona and voice prompt, and what is not a Moshi checkpoint (or a device
this machine lacks, or voice prompts it cannot read) fails start-up with a
reason."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import wave

import numpy as np
import pytest
import torch
import transformers

from duplex_bench.tiny_moshi import FRAME_SAMPLES, NUM_CODEBOOKS, tiny_moshi
from duplex_server import cli
from duplex_server.engine.duplex.prime import SILENCE_FRAMES
from duplex_server.engine.duplex.service import Prompt, StreamClosed
from duplex_server.engine.duplex.stepper import DuplexStepper, RowsFull
from duplex_server.models import build_model
from duplex_server.sessions.core.model_port import InputUnit, SteppedUnit, StreamSetup

UNITS = 6


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_moshi(tmp_path_factory.mktemp("moshi"))


@pytest.fixture(scope="module")
def model(checkpoint):
    built = build_model(f"moshi:{checkpoint}", device="cpu", dtype="float32", moshi_rows=2)
    assert built.service.wait_loaded(120), built.service.load_error  # type: ignore[attr-defined]
    yield built
    built.service.close()  # type: ignore[attr-defined]


def units(seed: int) -> list[InputUnit]:
    generator = np.random.default_rng(seed)
    return [
        InputUnit(
            index, (generator.standard_normal(FRAME_SAMPLES) * 3000).astype("<i2").tobytes(), 24_000
        )
        for index in range(UNITS)
    ]


async def steps(session, feed: list[InputUnit]):
    try:
        return [(await session.step(unit))[0] for unit in feed]
    finally:
        session.close()


async def run_session(model, session_id: str, feed: list[InputUnit]):
    session = model.streaming.open(session_id, StreamSetup())
    try:
        return [(await session.step(unit))[0] for unit in feed]
    finally:
        session.close()


def test_capabilities_say_what_is_true(model):
    caps = model.capabilities
    assert caps.implementation_level == "model_native_duplex"
    assert caps.chunk_period_ms == 80
    assert caps.supports_client_commit is False
    # it takes and yields the floor itself: no client turn commands
    assert caps.supports_barge_in is False and caps.supports_external_turn_signal is False
    assert caps.signal_sources == ["model_native"] and caps.supports_model_native_turn_policy
    assert set(caps.immutable_after_open) == {"model", "voice", "instructions", "temperature"}
    assert model.primes_at_input
    assert model.streaming is model and model.answering is None
    assert model.sample_rate_hz == 24_000 and model.unit_ms == 80
    assert model.loaded


async def test_sessions_are_stepped_together_and_each_hears_only_itself(model, checkpoint):
    feeds = [units(1), units(2)]
    ticks_before = len(model.service.tick_ms)
    together = await asyncio.gather(*(run_session(model, f"s{i}", f) for i, f in enumerate(feeds)))
    # one tick served both (the second may have joined a tick after the first)
    assert UNITS <= len(model.service.tick_ms) - ticks_before <= UNITS + 1
    reference = transformers.MoshiForConditionalGeneration.from_pretrained(checkpoint).eval()
    for feed, outputs in zip(feeds, together, strict=True):
        stepper = DuplexStepper(reference, rows=1)
        row = stepper.join()
        alone = [
            stepper.tick({row: np.frombuffer(u.pcm, "<i2").astype(np.float32) / 32768.0})[row]
            for u in feed
        ]
        assert outputs[0].decision == "listen" and not outputs[0].audio  # frame 0 is silence
        assert outputs[1].decision == "speak"  # the random model's first word
        for output, frame in zip(outputs[1:], alone[1:], strict=True):
            assert output.sample_rate_hz == 24_000 and len(output.audio) == 2 * FRAME_SAMPLES
            mine = np.frombuffer(output.audio, "<i2").astype(np.int32)
            expected = (np.clip(frame.samples, -1, 1) * 32767).astype("<i2").astype(np.int32)
            assert np.abs(mine - expected).max() <= 1  # float rounding of a batch of two
            assert output.text == model.service.token_text(frame.tokens.text)
    assert together[0][2].audio != together[1][2].audio


async def test_a_session_reopened_with_its_history_continues_while_others_tick(model):
    """A restored session's stream: opened with its logged units (input and
    tokens), it is rebuilt off the tick thread while another session keeps
    stepping, then continues with the tokens and voice of the uninterrupted
    run; the other session is not disturbed."""
    feed, other_feed = units(6), units(7)
    first = await run_session(model, "first", feed)
    other_alone = await run_session(model, "other-alone", other_feed)
    assert all(output.tokens is not None for output in first)
    logged = 3
    history = [SteppedUnit(unit, first[i].tokens) for i, unit in enumerate(feed[:logged])]
    other = model.streaming.open("other", StreamSetup())
    resumed = model.streaming.open("resumed", StreamSetup(), history)
    # each session steps on its own, as the feeds of two sessions do
    other_out, continued = await asyncio.gather(
        steps(other, other_feed), steps(resumed, feed[logged:])
    )
    assert [o.tokens for o in continued] == [o.tokens for o in first[logged:]]
    for mine, theirs in zip(continued, first[logged:], strict=True):
        got = np.frombuffer(mine.audio, "<i2").astype(np.int32)
        expected = np.frombuffer(theirs.audio, "<i2").astype(np.int32)
        assert got.shape == expected.shape and np.abs(got - expected).max() <= 1
    assert [o.tokens for o in other_out] == [o.tokens for o in other_alone]


async def test_a_session_beyond_the_rows_is_refused_at_its_first_unit(checkpoint):
    one_row = build_model(f"moshi:{checkpoint}", dtype="float32", moshi_rows=1)
    assert one_row.service.wait_loaded(120), one_row.service.load_error  # type: ignore[attr-defined]
    first, second = (one_row.streaming.open(name, StreamSetup()) for name in ("first", "second"))
    feed = units(3)
    try:
        await first.step(feed[0])
        with pytest.raises(RowsFull):
            await second.step(feed[0])
        assert (await first.step(feed[1]))[0].audio  # the batch goes on
    finally:
        first.close()
        second.close()
        one_row.service.close()  # type: ignore[attr-defined]


async def test_a_stream_that_stops_sending_is_closed_not_waited_for(model):
    """Ticks are lockstep; a session whose frames stop (its feed died) would
    hold every other session up, so after STALL_S it is closed instead."""
    stopped, going = (model.streaming.open(name, StreamSetup()) for name in ("stopped", "going"))
    feed = units(4)
    try:
        await stopped.step(feed[0])  # alone in the batch: one tick
        assert len(await going.step(feed[0])) == 1  # waited for `stopped`, then went on
        with pytest.raises(StreamClosed, match="no frame for 1 s"):
            await stopped.step(feed[1])
        assert len(await going.step(feed[1])) == 1
    finally:
        stopped.close()
        going.close()


async def test_a_unit_at_another_rate_is_refused(model):
    session = model.streaming.open("rate", StreamSetup())
    try:
        with pytest.raises(ValueError, match="1920 pcm16 samples at 24000 Hz"):
            await session.step(InputUnit(0, b"\0\0" * 1280, 16_000))
    finally:
        session.close()


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
    directory = tmp_path_factory.mktemp("voices")
    with wave.open(str(directory / "pirate.wav"), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)  # read at any rate, resampled to 24 kHz
        tone = np.sin(2 * np.pi * 180 * np.arange(16_000) / 16_000) * 0.3
        out.writeframes((tone * 32767).astype("<i2").tobytes())
    return directory


async def test_a_session_is_primed_with_its_persona_and_voice(checkpoint, voices):
    """The stream opens with the session's setup: its first frames are those
    of a stepper joined with the service's prime frames for that prompt (the
    text tokens of ``<system> ... <system>``, the voice's Mimi codes), and
    not those of an unprimed stream."""
    voiced = build_model(
        f"moshi:{checkpoint}", dtype="float32", moshi_rows=2, moshi_voices=str(voices)
    )
    service = voiced.service  # type: ignore[attr-defined]
    try:
        assert service.wait_loaded(120), service.load_error
        assert voiced.accepts_voice("pirate") and voiced.accepts_voice("alloy")
        assert not voiced.accepts_voice("nobody")
        setup = StreamSetup(instructions="be a kind pirate", voice="pirate")
        session = voiced.streaming.open("primed", setup)
        feed = units(6)
        try:
            primed = [(await session.step(unit))[0] for unit in feed]
        finally:
            session.close()
        tokens = service.prompt_tokens(setup.instructions)
        assert service.tokenizer.convert_ids_to_tokens(tokens) == [
            "\u2581" + word for word in ("<system>", "be", "a", "kind", "pirate", "<system>")
        ]
        prefix = service.prime_frames(Prompt(text_tokens=tokens, voice="pirate"))
        assert len(prefix) == 13 + SILENCE_FRAMES + len(tokens) + SILENCE_FRAMES  # 1 s of voice
        reference = transformers.MoshiForConditionalGeneration.from_pretrained(checkpoint).eval()
        stepper = DuplexStepper(reference, rows=1)
        row = stepper.join(prefix)
        expected = [stepper.tick({row: samples(unit)})[row] for unit in feed]
        unprimed = await run_session(voiced, "plain", feed)
        assert [o.text for o in primed] == [service.token_text(f.tokens.text) for f in expected]
        assert [o.audio for o in primed] != [o.audio for o in unprimed]
        for output, frame in zip(primed, expected, strict=True):
            if output.audio:
                mine = np.frombuffer(output.audio, "<i2").astype(np.int32)
                theirs = (np.clip(frame.samples, -1, 1) * 32767).astype("<i2").astype(np.int32)
                assert np.abs(mine - theirs).max() <= 1
    finally:
        service.close()


def samples(unit: InputUnit) -> np.ndarray:
    return np.frombuffer(unit.pcm, "<i2").astype(np.float32) / 32768.0


def test_instructions_the_model_cannot_prime_are_refused(model):
    assert model.instructions_refusal("") is None
    assert model.instructions_refusal("be a kind pirate") is None
    assert "at most 256" in model.instructions_refusal("be " * 300)
    assert "characters" in model.instructions_refusal("x" * 5000)


def test_a_checkpoint_without_a_tokenizer_primes_nothing(checkpoint, tmp_path, voices):
    bare = tmp_path / "bare"
    shutil.copytree(checkpoint, bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(ValueError, match="voice prompts need the checkpoint's tokenizer"):
        build_model(f"moshi:{bare}", moshi_voices=str(voices))
    plain = build_model(f"moshi:{bare}")
    try:
        assert "no tokenizer" in plain.instructions_refusal("be kind")
        assert plain.service.silent_text == frozenset()  # the floor is read off its voice level
    finally:
        plain.service.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "nowhere", "no such directory"),
        (lambda d: d, "no audio file"),
        (lambda d: (d / "x.wav").write_bytes(b"RIFF junk") and d, "x.wav: not an audio file"),
        (lambda d: (d / "q.wav").write_bytes(quiet_wav()) and d, "q.wav is silent"),
    ],
    ids=["missing", "empty", "not-audio", "silent"],
)
def test_voice_prompts_that_cannot_be_served_fail_start_up(checkpoint, tmp_path, make, message):
    with pytest.raises(ValueError, match=message):
        build_model(f"moshi:{checkpoint}", moshi_voices=str(make(tmp_path)))


def test_voices_are_for_the_moshi_model_only(tmp_path):
    with pytest.raises(ValueError, match="--voices primes a moshi:PATH model"):
        build_model("echo", moshi_voices=str(tmp_path))


def quiet_wav() -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(24_000)
        out.writeframes(bytes(48_000))
    return buffer.getvalue()


def moshi_config(checkpoint) -> dict:
    return json.loads((checkpoint / "config.json").read_text())


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d, c: shutil.rmtree(d), "no such directory"),
        (lambda d, c: (d / "config.json").unlink(), "no config.json"),
        (lambda d, c: (d / "config.json").write_text("{not json"), "not readable JSON"),
        (
            lambda d, c: (d / "config.json").write_text(json.dumps({"model_type": "whisper"})),
            "model_type 'whisper', not 'moshi'",
        ),
        (
            lambda d, c: (d / "config.json").write_text(
                json.dumps({**c, "audio_encoder_config": {"model_type": "encodec"}})
            ),
            "not a Mimi codec",
        ),
        (
            lambda d, c: (d / "config.json").write_text(
                json.dumps(
                    {
                        **c,
                        "depth_decoder_config": {**c["depth_decoder_config"], "sliding_window": 2},
                    }
                )
            ),
            f"sliding_window \\(2\\) is shorter than its {NUM_CODEBOOKS} codebooks",
        ),
    ],
    ids=["missing", "no-config", "bad-json", "not-moshi", "not-mimi", "short-depth-window"],
)
def test_what_is_not_a_moshi_checkpoint_fails_start_up(tmp_path, checkpoint, setup, message):
    directory = tmp_path / "model"
    shutil.copytree(checkpoint, directory)
    setup(directory, moshi_config(checkpoint))
    with pytest.raises(ValueError, match=message):
        build_model(f"moshi:{directory}")


def test_serve_exits_with_the_reason(tmp_path):
    config = cli.serve_config(["--model", f"moshi:{tmp_path / 'nowhere'}"], {})
    assert config.model == f"moshi:{tmp_path / 'nowhere'}"
    with pytest.raises(SystemExit, match="duplex-server: --model moshi:.*: no such directory"):
        cli.serve(config)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"device": "mps"}, "--device 'mps': 'cpu', 'cuda' or 'cuda:N'"),
        ({"device": "nonsense"}, "--device 'nonsense'"),
        ({"dtype": "int8"}, "--dtype 'int8'"),
        ({"moshi_rows": 0}, "at least one row"),
        ({"moshi_step": "compiled"}, "--moshi-step .compiled.: choose one of eager, fast"),
    ],
)
def test_bad_engine_options_fail_start_up(checkpoint, options, message):
    with pytest.raises(ValueError, match=message):
        build_model(f"moshi:{checkpoint}", **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_this_machine_lacks_fails_start_up(checkpoint):
    with pytest.raises(ValueError, match="no CUDA GPU"):
        build_model(f"moshi:{checkpoint}", device="cuda")


def test_the_step_bench_reports_tick_figures(checkpoint, capsys):
    from duplex_server.engine.duplex import bench_step

    bench_step.main([str(checkpoint), "--rows", "1", "2", "--frames", "3"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["rows"] for line in lines] == [1, 2]
    for line in lines:
        assert line["frames"] == 3
        assert 0 < line["tick_ms_p50"] <= line["tick_ms_p99"] <= line["tick_ms_max"]
        assert line["frames_per_s"] > 0 and 0 <= line["over_budget_ticks"] <= 3
