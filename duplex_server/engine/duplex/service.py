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

A stream opened with a ``Prompt`` (its persona's text tokens, a voice of
``--voices``) is primed as it joins, and one opened with a history (a
session restored from its log) is rebuilt after that priming by a
teacher-forced prefill over its logged frames. Both run in a batch of one
on a thread of their own (one at a time, in the order asked), so the live
rows keep ticking meanwhile; only the splice of the row into the batch
happens between two ticks. Until then the stream holds no row and the
batch does not wait for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import AutoTokenizer, MoshiForConditionalGeneration, PreTrainedTokenizerBase

from duplex_server import metrics
from duplex_server.engine.duplex.checkpoint import MoshiCheckpoint, MoshiCheckpointError
from duplex_server.engine.duplex.fast_step import FastDuplexStepper, make_stepper
from duplex_server.engine.duplex.prime import PromptCodes, prime_frames, system_text
from duplex_server.engine.duplex.prompt_codec import encode_frames, prompt_codes
from duplex_server.engine.duplex.sampling import GREEDY, Sampling
from duplex_server.engine.duplex.stepper import DuplexStepper, RowFrame, RowsFull
from duplex_server.engine.duplex.tokens import FrameTokens, PrimeFrame

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


@dataclass(frozen=True)
class Prompt:
    """What a stream is primed with before its first frame: the text
    prompt's tokens (empty: none) and a voice of the service (None: the
    checkpoint's own voice)."""

    text_tokens: tuple[int, ...] = ()
    voice: str | None = None


NO_PROMPT = Prompt()


@dataclass
class _Stream:
    row: int | None = None
    pending: deque[tuple[np.ndarray, Deliver]] = field(default_factory=deque)
    history: list[tuple[np.ndarray, FrameTokens]] | None = None  # to resume from
    prompt: Prompt = NO_PROMPT
    sampling: Sampling = GREEDY
    prefix: list[PrimeFrame] = field(default_factory=list)  # its prompt's frames
    rebuilding: bool = False  # being primed / prefilled off the tick thread
    rebuilt: DuplexStepper | None = None  # ... and is, ready to splice in
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
    """``voices``: each voice prompt's samples (float, 24 kHz), by name; they
    are Mimi-encoded once the model is loaded. The tokenizer loads at once
    (a session's instructions are counted in its tokens when it names them).
    ``step`` picks the batched step (``--moshi-step``: 'eager' or 'fast')."""

    def __init__(
        self,
        checkpoint: MoshiCheckpoint,
        *,
        device: str,
        dtype: str,
        rows: int,
        voices: Mapping[str, np.ndarray] | None = None,
        step: str = "eager",
    ) -> None:
        check_device(device)
        self.tokenizer = load_tokenizer(checkpoint)
        if voices and (self.tokenizer is None or self.tokenizer.pad_token_id is None):
            raise MoshiCheckpointError(
                f"{checkpoint.directory}: voice prompts need the checkpoint's tokenizer "
                "(its pad token is the text of a voice prompt's frames); it ships none with one"
            )
        self.voices = frozenset(voices or ())
        self._voice_audio = dict(voices or {})
        self._voice_codes: dict[str, list[tuple[int, ...]]] = {}
        self._prompt_codes: PromptCodes | None = None
        self.checkpoint = checkpoint
        self.rows = rows
        self._device, self._dtype, self._step = device, dtype, step
        self._cond = threading.Condition()
        self._streams: dict[int, _Stream] = {}
        self._next_stream = 0
        self._rebuilds: deque[_Stream] = deque()  # streams waiting for their prefill
        self._stopped = False
        self._loaded = threading.Event()
        self.load_error: str | None = None
        self.tick_ms: deque[float] = deque(maxlen=TICKS_KEPT)
        self.overruns = 0  # ticks longer than the 80 ms frame they stand for
        self._thread = threading.Thread(target=self._run, name="duplex-model", daemon=True)
        self._thread.start()

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set() and self.load_error is None

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._loaded.wait(timeout) and self.load_error is None

    def token_text(self, token: int) -> str:
        """A text token as words ('' without a tokenizer, and for special tokens)."""
        tokenizer = self.tokenizer
        if tokenizer is None or token in self.silent_text:
            return ""
        piece = tokenizer.convert_ids_to_tokens(token)
        return piece.replace("\u2581", " ") if isinstance(piece, str) else ""

    @property
    def silent_text(self) -> frozenset[int]:
        """The text tokens the model emits while it says nothing (its pad
        and the tokenizer's other special tokens); empty without a tokenizer."""
        tokenizer = self.tokenizer
        if tokenizer is None:
            return frozenset()
        pad = tokenizer.pad_token_id
        return frozenset(tokenizer.all_special_ids) | ({pad} if pad is not None else set())

    def prompt_tokens(self, instructions: str) -> tuple[int, ...]:
        """The text prompt's tokens for ``instructions`` ('' : none).
        ValueError when there is no tokenizer to read them with."""
        if not instructions.strip():
            return ()
        if self.tokenizer is None or self.tokenizer.pad_token_id is None:
            raise ValueError("this checkpoint ships no tokenizer with a pad token to prime with")
        return tuple(self.tokenizer.encode(system_text(instructions), add_special_tokens=False))

    def prime_frames(self, prompt: Prompt) -> list[PrimeFrame]:
        """The frames a stream opened with ``prompt`` is primed with (once loaded)."""
        if prompt == NO_PROMPT:
            return []
        if self._prompt_codes is None:
            raise StreamClosed("the model is not loaded, or cannot be primed")
        if prompt.voice is not None and prompt.voice not in self._voice_codes:
            raise ValueError(f"no voice {prompt.voice!r}")
        voice = self._voice_codes[prompt.voice] if prompt.voice is not None else []
        return prime_frames(self._prompt_codes, prompt.text_tokens, voice)

    def open_stream(
        self,
        history: list[tuple[np.ndarray, FrameTokens]] | None = None,
        prompt: Prompt = NO_PROMPT,
        sampling: Sampling = GREEDY,
    ) -> int:
        """A new stream, primed with ``prompt`` as it joins; ``history``
        (logged frames, after that priming) makes it resume where those left
        off; ``sampling``: greedy, or a temperature and the stream's seed."""
        if prompt.voice is not None and prompt.voice not in self.voices:
            raise ValueError(f"no voice {prompt.voice!r} (--voices names {sorted(self.voices)})")
        with self._cond:
            stream = self._next_stream
            self._next_stream += 1
            self._streams[stream] = _Stream(history=history, prompt=prompt, sampling=sampling)
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
            self._cond.notify_all()

    def close_stream(self, stream: int) -> None:
        with self._cond:
            state = self._streams.get(stream)
            if state is not None and state.reason:  # the service closed it already
                del self._streams[stream]
            elif state is not None:
                state.closed = True
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join()

    # --- the tick thread ------------------------------------------------------

    def _run(self) -> None:
        try:
            model = load_moshi(self.checkpoint, self._device, self._dtype)
            self._prepare_prompts(model)
            # the fast step refuses a checkpoint without a window; its ring may not fit
            stepper = make_stepper(model, self.rows, self._step)
            if isinstance(stepper, FastDuplexStepper):
                stepper.capture()  # its CUDA graphs, before any session's tick
        except (OSError, ValueError, RuntimeError) as exc:
            self.load_error = f"cannot load {self.checkpoint.directory}: {exc}"
            logger.error("moshi: %s", self.load_error)
            self._loaded.set()
            self._fail_all(StreamClosed(self.load_error))
            return
        threading.Thread(
            target=self._rebuild_streams, args=(model,), name="duplex-rebuild", daemon=True
        ).start()
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
                    if stream.rebuilt is None and (stream.history or stream.prompt != NO_PROMPT):
                        self._ask_rebuild(stream)
                        continue
                    stream.row = self._join(stepper, stream)
                except (RowsFull, ValueError, StreamClosed) as exc:  # refused, never a dead tick
                    stream.closed = True
                    self._fail(stream, exc)

    def _prepare_prompts(self, model: MoshiForConditionalGeneration) -> None:
        """The fixed prompt codes and each voice prompt's codes, from the
        model's own Mimi; the voices' samples are let go."""
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else None
        if pad is None:
            return
        self._prompt_codes = prompt_codes(model, pad)
        self._voice_codes = {
            name: encode_frames(model, samples) for name, samples in self._voice_audio.items()
        }
        self._voice_audio = {}

    def _join(self, stepper: DuplexStepper, stream: _Stream) -> int:
        rebuilt, stream.rebuilt, stream.history = stream.rebuilt, None, None
        row = stepper.adopt(rebuilt) if rebuilt is not None else stepper.join()
        stepper.sample(row, stream.sampling)
        return row

    def _ask_rebuild(self, stream: _Stream) -> None:
        """Queue the stream's priming and prefill (its prompt's frames are
        laid out here: a prompt that cannot be served is refused at once)."""
        if not stream.rebuilding:
            stream.prefix = self.prime_frames(stream.prompt)
            stream.rebuilding = True
            self._rebuilds.append(stream)
            self._cond.notify_all()

    def _rebuild_streams(self, model: MoshiForConditionalGeneration) -> None:
        """The rebuild thread: prime and prefill each asked stream in turn."""
        while True:
            with self._cond:
                while not self._rebuilds and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                stream = self._rebuilds.popleft()
            if stream.closed:
                continue
            try:
                rebuilt = DuplexStepper.rebuild(model, stream.history or [], stream.prefix)
            except RuntimeError as exc:  # the device failed (out of memory): this stream ends
                logger.error("moshi: rebuilding a stream failed: %s", exc)
                with self._cond:
                    stream.closed, stream.reason = True, f"its prefill failed: {exc}"
                    self._cond.notify_all()
                continue
            with self._cond:
                stream.rebuilt, stream.rebuilding = rebuilt, False
                self._cond.notify_all()

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
