"""One Moshi-architecture model serving many streams, frame-synchronously.

A thread of its own loads the checkpoint (``loaded`` turns true, or
``load_error`` says why not), then ticks: it waits until every stream that
holds a row has its next frame queued, takes one frame from each, and runs
one batched ``DuplexStepper.tick``. Each stream's result is handed to the
callback given with its frame, on this thread (the asyncio side crosses
back with ``call_soon_threadsafe``).

Ticks are lockstep: a stream whose frame is late delays the tick for all
(the session side clocks silence frames while its client pauses, so a
frame comes every 80 ms). Nothing is invented for a late stream: sitting a
tick out would shorten that row's sliding attention window by the ticks it
missed, which breaks the exact replay a resume relies on.

Streams join the batch with their first frame and leave when closed, both
between ticks; a stream that finds every row taken gets ``RowsFull``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import AutoTokenizer, MoshiForConditionalGeneration, PreTrainedTokenizerBase

from duplex_server import metrics
from duplex_server.engine.duplex.checkpoint import MoshiCheckpoint, MoshiCheckpointError
from duplex_server.engine.duplex.fast_step import make_stepper
from duplex_server.engine.duplex.stepper import DuplexStepper, RowFrame, RowsFull
from duplex_server.engine.duplex.tokens import FrameTokens

logger = logging.getLogger(__name__)

FRAME_SAMPLES = 1920  # 80 ms at 24 kHz: the unit the port promises
FRAME_MS = 80.0
MODEL_LABEL = "moshi"  # the {model} label of the tick series
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Recent tick durations kept for the figures (`tick_ms`).
TICKS_KEPT = 4096
# A stream holding a row that sends no frame for this long while others wait
# is closed (its session's feed stopped): lockstep must not wait forever.
STALL_S = 1.0

Deliver = Callable[[RowFrame | BaseException], None]


class StreamClosed(Exception):
    """The stream was closed (or the service shut down) before its frame ran."""


@dataclass
class _Stream:
    row: int | None = None
    pending: deque[tuple[np.ndarray, Deliver]] = field(default_factory=deque)
    history: list[tuple[np.ndarray, FrameTokens]] | None = None  # to resume from
    closed: bool = False
    reason: str = ""  # why it was closed, if not by its owner


def load_moshi(
    checkpoint: MoshiCheckpoint, device: str, dtype: str
) -> MoshiForConditionalGeneration:
    """The model on ``device`` in ``dtype`` ('auto': the checkpoint's own), checked to serve."""
    model = MoshiForConditionalGeneration.from_pretrained(
        checkpoint.directory, dtype=_DTYPES.get(dtype, "auto"), local_files_only=True
    )
    # nn.Module's own `to` (PreTrainedModel's wrapper confuses the type checker)
    model = torch.nn.Module.to(model, check_device(device)).eval()
    frame = int(model.audio_encoder.config.frame_size)
    if frame != FRAME_SAMPLES:
        raise MoshiCheckpointError(
            f"its Mimi codec's frame is {frame} samples; this server serves {FRAME_SAMPLES} "
            "(80 ms at 24 kHz: up-sampling ratios 8, 6, 5, 4 and a stride-2 downsample)"
        )
    return model


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def check_device(device: str) -> torch.device:
    """The torch device named by ``--device``, refused now if this machine has none such."""
    try:
        parsed = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"--device {device!r}: {exc}") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this machine (or this torch build) has no CUDA GPU")
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: 'cpu', 'cuda' or 'cuda:N'")
    return parsed


def load_tokenizer(checkpoint: MoshiCheckpoint) -> PreTrainedTokenizerBase | None:
    """The checkpoint's text tokenizer, if it ships one (the model's text tokens become words)."""
    if not any((checkpoint.directory / name).is_file() for name in TOKENIZER_FILES):
        return None
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
        checkpoint.directory, local_files_only=True
    )
    return tokenizer


class DuplexService:
    def __init__(
        self,
        checkpoint: MoshiCheckpoint,
        *,
        device: str,
        dtype: str,
        rows: int,
        step: str = "eager",
    ) -> None:
        check_device(device)
        self.checkpoint = checkpoint
        self.rows = rows
        self._device, self._dtype, self._step = device, dtype, step
        self._cond = threading.Condition()
        self._streams: dict[int, _Stream] = {}
        self._next_stream = 0
        self._stopped = False
        self._loaded = threading.Event()
        self.load_error: str | None = None
        self.tick_ms: deque[float] = deque(maxlen=TICKS_KEPT)
        self.overruns = 0  # ticks longer than the 80 ms frame they stand for
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._thread = threading.Thread(target=self._run, name="duplex-model", daemon=True)
        self._thread.start()

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set() and self.load_error is None

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._loaded.wait(timeout) and self.load_error is None

    def token_text(self, token: int) -> str:
        """A text token as words ('' without a tokenizer, and for special tokens)."""
        tokenizer = self._tokenizer
        if tokenizer is None or token in tokenizer.all_special_ids:
            return ""
        piece = tokenizer.convert_ids_to_tokens(token)
        return piece.replace("\u2581", " ") if isinstance(piece, str) else ""

    def open_stream(self, history: list[tuple[np.ndarray, FrameTokens]] | None = None) -> int:
        """A new stream; ``history`` (logged frames) makes it resume where those left off."""
        with self._cond:
            stream = self._next_stream
            self._next_stream += 1
            self._streams[stream] = _Stream(history=history)
            return stream

    def submit(self, stream: int, samples: np.ndarray, deliver: Deliver) -> None:
        """Queue the stream's next frame (``FRAME_SAMPLES`` floats in -1..1)."""
        if samples.shape != (FRAME_SAMPLES,):
            raise ValueError(f"a frame is {FRAME_SAMPLES} samples, got {samples.shape}")
        with self._cond:
            state = self._streams.get(stream)
            if self.load_error is not None:
                raise StreamClosed(self.load_error)
            if state is None or state.closed or self._stopped:
                reason = state.reason if state is not None and state.reason else "closed"
                raise StreamClosed(f"stream {stream}: {reason}")
            state.pending.append((samples, deliver))
            self._cond.notify()

    def close_stream(self, stream: int) -> None:
        with self._cond:
            state = self._streams.get(stream)
            if state is not None and state.reason:  # the service closed it already
                del self._streams[stream]
            elif state is not None:
                state.closed = True
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()

    # --- the tick thread ------------------------------------------------------

    def _run(self) -> None:
        try:
            model = load_moshi(self.checkpoint, self._device, self._dtype)
            self._tokenizer = load_tokenizer(self.checkpoint)
            # the fast step refuses a checkpoint without a window; its ring may not fit
            stepper = make_stepper(model, self.rows, self._step)
        except (OSError, ValueError, RuntimeError) as exc:
            self.load_error = f"cannot load {self.checkpoint.directory}: {exc}"
            logger.error("moshi: %s", self.load_error)
            self._loaded.set()
            self._fail_all(StreamClosed(self.load_error))
            return
        self._loaded.set()
        logger.info("moshi: loaded %s (%d rows)", self.checkpoint.directory, self.rows)
        while (batch := self._next_batch(stepper)) is not None:
            self._tick(stepper, batch)
        self._fail_all(StreamClosed("the duplex model is shut down"))

    def _next_batch(self, stepper: DuplexStepper) -> dict[int, tuple[np.ndarray, Deliver]] | None:
        """Wait until every stream holding a row has a frame; take one from each.

        A stream that keeps the others waiting ``STALL_S`` is closed instead.
        """
        waiting_since: float | None = None
        with self._cond:
            while not self._stopped:
                self._admit(stepper)
                live = [s for s in self._streams.values() if s.row is not None]
                if live and all(s.pending for s in live):
                    return {s.row: s.pending.popleft() for s in live if s.row is not None}
                if not any(s.pending for s in live):
                    waiting_since = None
                    self._cond.wait()
                    continue
                now = time.monotonic()
                waiting_since = now if waiting_since is None else waiting_since
                if now - waiting_since >= STALL_S:
                    self._close_stalled(live)
                    continue
                self._cond.wait(STALL_S - (now - waiting_since))
        return None

    def _close_stalled(self, live: list[_Stream]) -> None:
        for stream in live:
            if not stream.pending:
                stream.closed = True
                stream.reason = f"no frame for {STALL_S:g} s while the batch waited"
                logger.warning("moshi: closing a stalled stream (row %s)", stream.row)

    def _admit(self, stepper: DuplexStepper) -> None:
        """Between ticks: closed streams leave, new streams with a frame join."""
        for key, stream in list(self._streams.items()):
            if stream.closed:
                if stream.row is not None:
                    stepper.leave(stream.row)
                    stream.row = None
                if not stream.reason:  # its owner closed it; else kept to tell the owner why
                    del self._streams[key]
                self._fail(stream, StreamClosed(f"stream {key}: {stream.reason or 'closed'}"))
            elif stream.row is None and stream.pending:
                try:
                    stream.row = self._join(stepper, stream)
                except RowsFull as exc:
                    stream.closed = True
                    self._fail(stream, exc)

    def _join(self, stepper: DuplexStepper, stream: _Stream) -> int:
        if stream.history:
            return stepper.resume(stream.history)
        return stepper.join()

    def _tick(self, stepper: DuplexStepper, batch: dict[int, tuple[np.ndarray, Deliver]]) -> None:
        started = time.perf_counter()
        try:
            out = stepper.tick({row: samples for row, (samples, _) in batch.items()})
        except RuntimeError as exc:  # the device failed (out of memory): these streams end
            logger.error("moshi: tick failed: %s", exc)
            with self._cond:
                for stream in self._streams.values():
                    stream.closed = stream.closed or stream.row in batch
            for _, deliver in batch.values():
                deliver(exc)
            return
        spent_ms = (time.perf_counter() - started) * 1000
        self.tick_ms.append(spent_ms)
        self.overruns += spent_ms > FRAME_MS
        metrics.MODEL_TICK.labels(MODEL_LABEL).observe(spent_ms / 1000)
        if spent_ms > FRAME_MS:  # counted, never absorbed: the next frames are late by it
            metrics.MODEL_TICK_OVERRUNS.labels(MODEL_LABEL).inc()
        for row, (_, deliver) in batch.items():
            deliver(out[row])

    def _fail(self, stream: _Stream, error: BaseException) -> None:
        pending, stream.pending = stream.pending, deque()
        for _, deliver in pending:
            deliver(error)

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            streams = list(self._streams.values())
        for stream in streams:
            self._fail(stream, error)
