"""The ``moshi`` model on the streaming port: each session a stream of the
frame-synchronous engine, one 80 ms unit in, one frame of the model's voice
and its text token out, the floor read off its text (``floor``).

A session's stream opens at its first input audio, primed with the
session's ``instructions`` (a text persona) and ``voice`` (a voice prompt
of ``--voices DIR``), as PersonaPlex conditions the model, and sampling at
the session's ``temperature`` (0: greedy) with a seed derived from the
session's id, so a resumed session draws what it would have drawn; all
three are fixed from then on (gates.py refuses a change).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from duplex_server.engine.duplex.checkpoint import DTYPES, MOSHI_STEPS, check_moshi_checkpoint
from duplex_server.engine.duplex.prime import MAX_PROMPT_TOKENS
from duplex_server.engine.duplex.tokens import FrameTokens
from duplex_server.models.capabilities import built_in
from duplex_server.models.moshi.floor import TALKING_RMS, Floor, rms, voiced_by_level
from duplex_server.models.moshi.voices import load_voices
from duplex_server.sessions.core.model_port import InputUnit, SteppedUnit, StreamSetup, UnitOutput
from protocol.capabilities import MODEL_NATIVE

if TYPE_CHECKING:
    from duplex_server.engine.duplex.service import DuplexService, Prompt, Sampling
    from duplex_server.engine.duplex.stepper import RowFrame

RATE_HZ = 24_000
UNIT_MS = 80
FRAME_SAMPLES = RATE_HZ * UNIT_MS // 1000
# The checkpoint's own voice: the session default and OpenAI's voice names
# (stock clients send one), unless --voices has a file by that name.
OWN_VOICE_NAMES = frozenset(
    {"default", "alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin"}
    | {"cedar"}
)
# A resume rebuilds from every unit the call stepped, not only its latest
# window: the keys and values the window holds were computed, layer by
# layer, from frames further back (the rows above attend a window of the
# rows below), the codec's state from its own history, and each frame's
# sampling noise is drawn at its frame number. Only the whole log gives back
# the uninterrupted call's state; ``DuplexStepper.rebuild`` prefills it a
# window of frames a forward (a 7,500-frame call in 1.1 s on an H100).
WHOLE_CALL = sys.maxsize
# Instructions longer than this are refused before they are tokenized
# (a token is at least one character).
MAX_INSTRUCTION_CHARS = MAX_PROMPT_TOKENS * 16


def _pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


class MoshiSession:
    """One session's stream; ``step`` is called once per unit, in order."""

    def __init__(
        self,
        service: DuplexService,
        prompt: Prompt,
        sampling: Sampling,
        history: Sequence[SteppedUnit] = (),
    ) -> None:
        self._service = service
        # A restored session's row is primed again with the same prompt and
        # rebuilt from its logged units (a teacher-forced prefill) when its
        # first new frame joins the batch.
        logged = [(_samples(s.unit), FrameTokens(s.tokens[0], s.tokens[1:])) for s in history]
        self._stream = service.open_stream(logged or None, prompt=prompt, sampling=sampling)
        self._floor = Floor()

    async def step(self, unit: InputUnit) -> list[UnitOutput]:
        samples = _samples(unit)
        loop = asyncio.get_running_loop()
        result: asyncio.Future[RowFrame] = loop.create_future()

        def deliver(frame: RowFrame | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the session's loop is gone: nobody waits
                loop.call_soon_threadsafe(_settle, result, frame)

        self._service.submit(self._stream, samples, deliver)
        return [self._output(await result, rms(samples) > TALKING_RMS)]

    def _output(self, frame: RowFrame, user_talking: bool) -> UnitOutput:
        silent = self._service.silent_text
        voiced = frame.tokens.text not in silent if silent else voiced_by_level(frame.samples)
        decision = self._floor.update(voiced and frame.step > 0, user_talking)
        tokens = (frame.tokens.text, *frame.tokens.audio)  # logged: what a resume feeds back
        if decision in ("listen", "end_of_turn", "yield"):
            return UnitOutput(decision=decision, tokens=tokens)
        return UnitOutput(
            decision=decision,
            audio=_pcm16(frame.samples),
            sample_rate_hz=RATE_HZ,
            text=self._service.token_text(frame.tokens.text),
            tokens=tokens,
        )

    def interrupt(self) -> None:
        self._floor.interrupt()

    def close(self) -> None:
        self._service.close_stream(self._stream)


def _samples(unit: InputUnit) -> np.ndarray:
    """A unit's pcm16 as the model's float input (-1..1)."""
    if unit.sample_rate_hz != RATE_HZ or len(unit.pcm) != 2 * FRAME_SAMPLES:
        raise ValueError(f"a moshi unit is {FRAME_SAMPLES} pcm16 samples at {RATE_HZ} Hz")
    return np.frombuffer(unit.pcm, "<i2").astype(np.float32) / 32768.0


def _settle(result: asyncio.Future[RowFrame], frame: RowFrame | BaseException) -> None:
    if result.done():
        return
    if isinstance(frame, BaseException):
        result.set_exception(frame)
    else:
        result.set_result(frame)


def session_seed(session_id: str) -> int:
    """The seed a session's sampling draws from: a function of its id alone,
    so a restarted or taking-over replica draws the same."""
    return int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest()) >> 1


class MoshiModel:
    name = "moshi"
    turn_detection_types: tuple[str, ...] = ()
    listening = None  # it hears through its own stream; no VAD, no transcripts
    answering = None  # it never waits for a commit
    # It takes and gives back the floor by itself, unit by unit (a yield to
    # the user's speech is its own): a client's commit or turn signal is not
    # its cue, though a client's cancel still fences its answer. It hears
    # audio only; its persona and voice are primed once, at the first input.
    capabilities = msgspec.structs.replace(
        built_in(
            "model_native_duplex",
            UNIT_MS,
            signal_sources=[MODEL_NATIVE],
            native_turn_policy=True,
            required_input_modalities=["audio"],
            optional_input_modalities=[],
            text_only_turn=False,
        ),
        supports_client_commit=False,
        supports_external_turn_signal=False,
        supports_barge_in=False,
        immutable_after_open=["model", "voice", "instructions", "temperature"],
    )
    sample_rate_hz = RATE_HZ
    unit_ms = UNIT_MS
    primes_at_input = True

    def __init__(self, service: DuplexService) -> None:
        self.service = service
        self.resume_units = WHOLE_CALL

    @property
    def streaming(self) -> MoshiModel:
        return self

    @property
    def loaded(self) -> bool:
        return self.service.loaded

    def open(
        self, session_id: str, setup: StreamSetup, history: Sequence[SteppedUnit] = ()
    ) -> MoshiSession:
        from duplex_server.engine.duplex.service import Prompt, Sampling

        voice = setup.voice if setup.voice in self.service.voices else None
        tokens = self.service.prompt_tokens(setup.instructions)
        prompt = Prompt(text_tokens=tokens, voice=voice)
        sampling = Sampling(setup.temperature, session_seed(session_id))
        return MoshiSession(self.service, prompt, sampling, history)

    def accepts_voice(self, voice: str) -> bool:
        """A voice prompt of ``--voices DIR`` by name, or the checkpoint's own
        voice (the default, and OpenAI's names where no file is so named)."""
        return voice in self.service.voices or voice in OWN_VOICE_NAMES

    def instructions_refusal(self, instructions: str) -> str | None:
        if not instructions.strip():
            return None
        if len(instructions) > MAX_INSTRUCTION_CHARS:
            return f"instructions over {MAX_INSTRUCTION_CHARS} characters cannot be primed"
        try:
            tokens = self.service.prompt_tokens(instructions)
        except ValueError as exc:
            return f"instructions cannot be primed: {exc}"
        if len(tokens) > MAX_PROMPT_TOKENS:
            return (
                f"instructions are {len(tokens)} tokens as the model reads them; "
                f"it is primed with at most {MAX_PROMPT_TOKENS}"
            )
        return None


def build_moshi(
    path: str,
    *,
    device: str,
    dtype: str,
    rows: int,
    voices: str | None = None,
    step: str = "eager",
) -> MoshiModel:
    """Check ``path`` (and ``voices``) now: start-up fails on a directory that
    is not a Moshi checkpoint, or voice prompts that cannot be served; the
    weights load on the engine's thread."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if rows < 1:
        raise ValueError("the moshi engine needs at least one row (--max-sessions)")
    if step not in MOSHI_STEPS:
        raise ValueError(f"--moshi-step {step!r}: choose one of {', '.join(MOSHI_STEPS)}")
    checkpoint = check_moshi_checkpoint(path)
    prompts: Mapping[str, np.ndarray] = load_voices(voices) if voices is not None else {}
    # Imported here: torch and transformers load only when this model is asked for.
    from duplex_server.engine.duplex.service import DuplexService

    service = DuplexService(
        checkpoint, device=device, dtype=dtype, rows=rows, voices=prompts, step=step
    )
    return MoshiModel(service)
