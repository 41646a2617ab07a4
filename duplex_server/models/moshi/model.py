"""The ``moshi`` model on the streaming port: each session a stream of the
frame-synchronous engine, one 80 ms unit in, one frame of the model's voice
(and its text token) out, the floor read off that voice (``floor``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from duplex_server.engine.duplex.checkpoint import DTYPES, MOSHI_STEPS, check_moshi_checkpoint
from duplex_server.models.capabilities import built_in
from duplex_server.models.moshi.floor import Floor
from duplex_server.sessions.core.model_port import InputUnit, UnitOutput
from protocol.capabilities import CLIENT_EVENT, MODEL_NATIVE

if TYPE_CHECKING:
    from duplex_server.engine.duplex.service import DuplexService
    from duplex_server.engine.duplex.stepper import RowFrame

RATE_HZ = 24_000
UNIT_MS = 80
FRAME_SAMPLES = RATE_HZ * UNIT_MS // 1000


def _pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


class MoshiSession:
    """One session's stream; ``step`` is called once per unit, in order."""

    def __init__(self, service: DuplexService) -> None:
        self._service = service
        self._stream = service.open_stream()
        self._floor = Floor()

    async def step(self, unit: InputUnit) -> list[UnitOutput]:
        if unit.sample_rate_hz != RATE_HZ or len(unit.pcm) != 2 * FRAME_SAMPLES:
            raise ValueError(f"a moshi unit is {FRAME_SAMPLES} pcm16 samples at {RATE_HZ} Hz")
        samples = np.frombuffer(unit.pcm, "<i2").astype(np.float32) / 32768.0
        loop = asyncio.get_running_loop()
        result: asyncio.Future[RowFrame] = loop.create_future()

        def deliver(frame: RowFrame | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the session's loop is gone: nobody waits
                loop.call_soon_threadsafe(_settle, result, frame)

        self._service.submit(self._stream, samples, deliver)
        return [self._output(await result)]

    def _output(self, frame: RowFrame) -> UnitOutput:
        decision = self._floor.update(frame.samples)
        if decision in ("listen", "end_of_turn"):
            return UnitOutput(decision=decision)
        return UnitOutput(
            decision=decision,
            audio=_pcm16(frame.samples),
            sample_rate_hz=RATE_HZ,
            text=self._service.token_text(frame.tokens.text),
        )

    def interrupt(self) -> None:
        self._floor.interrupt()

    def close(self) -> None:
        self._service.close_stream(self._stream)


def _settle(result: asyncio.Future[RowFrame], frame: RowFrame | BaseException) -> None:
    if result.done():
        return
    if isinstance(frame, BaseException):
        result.set_exception(frame)
    else:
        result.set_result(frame)


class MoshiModel:
    name = "moshi"
    turn_detection_types: tuple[str, ...] = ()
    listening = None  # it hears through its own stream; no VAD, no transcripts
    answering = None  # it never waits for a commit
    # It takes and gives back the floor by itself, unit by unit; a client's
    # cancel or barge-in still fences its answer. It hears audio only.
    capabilities = msgspec.structs.replace(
        built_in(
            "model_native_duplex",
            UNIT_MS,
            signal_sources=[CLIENT_EVENT, MODEL_NATIVE],
            native_turn_policy=True,
            required_input_modalities=["audio"],
            optional_input_modalities=[],
            text_only_turn=False,
        ),
        supports_client_commit=False,
    )
    sample_rate_hz = RATE_HZ
    unit_ms = UNIT_MS

    def __init__(self, service: DuplexService) -> None:
        self.service = service

    @property
    def streaming(self) -> MoshiModel:
        return self

    @property
    def loaded(self) -> bool:
        return self.service.loaded

    def open(self, session_id: str) -> MoshiSession:
        return MoshiSession(self.service)

    def accepts_voice(self, voice: str) -> bool:
        """Voice prompts (``--voices DIR``) are not wired yet: every name speaks
        in the checkpoint's own voice."""
        return True


def build_moshi(
    path: str, *, device: str, dtype: str, rows: int, step: str = "eager"
) -> MoshiModel:
    """Check ``path`` now (start-up fails on a directory that is not a Moshi
    checkpoint); the weights load on the engine's thread."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if rows < 1:
        raise ValueError("the moshi engine needs at least one row (--max-sessions)")
    if step not in MOSHI_STEPS:
        raise ValueError(f"--moshi-step {step!r}: choose one of {', '.join(MOSHI_STEPS)}")
    checkpoint = check_moshi_checkpoint(path)
    # Imported here: torch and transformers load only when this model is asked for.
    from duplex_server.engine.duplex.service import DuplexService

    return MoshiModel(DuplexService(checkpoint, device=device, dtype=dtype, rows=rows, step=step))
