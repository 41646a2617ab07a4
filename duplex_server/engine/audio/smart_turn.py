"""Pipecat's Smart Turn v3.2: whether the speaker has finished their turn.

The model (``smart-turn-v3.2-cpu.onnx``, BSD-2-Clause, Daily) ships inside the
``pipecat-ai`` wheel pinned in the Makefile; the file is found through the
wheel's metadata, never by importing pipecat (its import pulls in most of a
framework). It reads the last 8 s of a turn at 16 kHz, zero-padded in front,
as Whisper's 80-bin log-mel features, and answers the probability that the
turn is complete.

One :class:`SmartTurn` serves the whole process: a single thread takes every
request waiting in its bounded queue into one ONNX batch (features are
computed there too), so sessions pausing together cost one run, and the
event loop never computes a feature or waits on the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import queue
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from duplex_server import metrics
from duplex_server.audio import resample_pcm16

DISTRIBUTION = "pipecat-ai"
MODEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
SAMPLE_RATE_HZ = 16_000
WINDOW_S = 8  # the model hears the turn's last 8 s
# Requests waiting for the model: past this many, a pause is not judged
# (the turn then ends at its longest wait) rather than judged late.
QUEUE_LIMIT = 256
BATCH_LIMIT = 32  # requests in one ONNX run

# Whisper's feature extractor, as the model was trained on it.
_N_FFT = 400
_HOP = 160
_N_MELS = 80
_SAMPLES = SAMPLE_RATE_HZ * WINDOW_S


class TurnModelBusy(Exception):
    """The model's queue is full: this pause goes unjudged."""


class TurnModelFailed(RuntimeError):
    """The model raised on a batch (its cause chained): those pauses go unjudged."""


def model_path() -> Path | None:
    """Where the installed pipecat-ai wheel keeps the model, or None."""
    try:
        path = Path(str(importlib.metadata.distribution(DISTRIBUTION).locate_file(MODEL_FILE)))
    except importlib.metadata.PackageNotFoundError:
        return None
    return path if path.is_file() else None


def _slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    step = 27.0 / np.log(6.4)
    above = 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) * step
    return np.where(hz < 1000.0, 3.0 * hz / 200.0, above)


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    step = np.log(6.4) / 27.0
    return np.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * np.exp(step * (mel - 15.0)))


@cache
def _filters() -> tuple[np.ndarray, np.ndarray]:
    """The periodic Hann window and the area-normalised mel filterbank
    (frequency bins x mels), as Whisper's extractor builds them."""
    window = np.hanning(_N_FFT + 1)[:-1]
    edges = _slaney_hz(np.linspace(0.0, _slaney_mel(np.array(SAMPLE_RATE_HZ / 2)), _N_MELS + 2))
    bins = np.linspace(0, SAMPLE_RATE_HZ // 2, _N_FFT // 2 + 1)
    rise = (bins[:, None] - edges[None, :-2]) / (edges[1:-1] - edges[:-2])
    fall = (edges[None, 2:] - bins[:, None]) / (edges[2:] - edges[1:-1])
    bank = np.maximum(0.0, np.minimum(rise, fall))
    bank *= 2.0 / (edges[2:] - edges[:-2])
    return window, bank


def window_of(pcm16: bytes, sample_rate_hz: int) -> np.ndarray:
    """The turn's last 8 s at 16 kHz as float32 in [-1, 1], zeros in front."""
    tail = pcm16[-2 * (WINDOW_S * sample_rate_hz + sample_rate_hz // 10) :]  # 8.1 s
    pcm = resample_pcm16(tail, sample_rate_hz, SAMPLE_RATE_HZ)
    audio = np.frombuffer(pcm, dtype="<i2")[-_SAMPLES:].astype(np.float32) / 32768.0
    return np.concatenate([np.zeros(_SAMPLES - audio.size, np.float32), audio])


def log_mel(audio: np.ndarray) -> np.ndarray:
    """Whisper's log-mel features (80 x 800) of 8 s of 16 kHz audio,
    normalised to zero mean and unit variance first (``do_normalize``)."""
    x = audio.astype(np.float32)
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    window, bank = _filters()
    half = _N_FFT // 2
    padded = np.pad(x.astype(np.float64), (half, half), mode="reflect")
    frames = sliding_window_view(padded, _N_FFT)[::_HOP]
    power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
    mel = np.log10(np.maximum(power @ bank, 1e-10)).T[:, :-1]
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


@dataclass
class _Request:
    pcm16: bytes
    sample_rate_hz: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[float]
    queued_at: float


class SmartTurn:
    """The model and its one thread; :meth:`probability` is the session's call."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        self.path = path
        self._threads = threads
        self._queue: queue.Queue[_Request] = queue.Queue(maxsize=QUEUE_LIMIT)
        self._depth = metrics.ENGINE_QUEUE_DEPTH.labels("smart_turn")
        self._latency = metrics.STAGE_LATENCY.labels("turn")
        self._start = threading.Lock()
        self._thread: threading.Thread | None = None
        self._onnx: Any = None

    @staticmethod
    @cache
    def shared() -> SmartTurn | None:
        """The process's one instance, or None where the wheel is not installed
        (semantic_vad is then refused: config.SEMANTIC_VAD_MISSING)."""
        path = model_path()
        return None if path is None else SmartTurn(path)

    async def probability(self, pcm16: bytes, sample_rate_hz: int) -> float:
        """The probability that the turn in ``pcm16`` is complete (its audio
        so far, trailing pause included). Raises :class:`TurnModelBusy`."""
        self._ensure_started()
        loop = asyncio.get_running_loop()
        request = _Request(pcm16, sample_rate_hz, loop, loop.create_future(), time.perf_counter())
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            raise TurnModelBusy(f"{QUEUE_LIMIT} pauses wait for the end-of-turn model") from None
        self._depth.set(self._queue.qsize())
        return await request.future

    def predict(self, windows: list[np.ndarray]) -> list[float]:
        """Blocking: each 8 s window's probability, in one batch."""
        features = np.stack([log_mel(window) for window in windows])
        (logits,) = self._session().run(None, {"input_features": features})
        return [float(p) for p in np.asarray(logits).reshape(-1)]

    def _session(self) -> Any:
        """The ONNX session, loaded on first use (a server that never serves
        semantic_vad never loads it)."""
        with self._start:
            if self._onnx is None:
                import onnxruntime as ort

                options = ort.SessionOptions()
                options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                options.inter_op_num_threads = 1
                options.intra_op_num_threads = self._threads
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                self._onnx = ort.InferenceSession(str(self.path), sess_options=options)
            return self._onnx

    def _ensure_started(self) -> None:
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="smart-turn", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < BATCH_LIMIT:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._depth.set(self._queue.qsize())
            try:
                windows = [window_of(r.pcm16, r.sample_rate_hz) for r in batch]
                outcome: list[float] | BaseException = self.predict(windows)
            except Exception as exc:  # the thread serves every session: it must go on
                failure = TurnModelFailed(f"Smart Turn failed on {len(batch)} pauses: {exc!r}")
                failure.__cause__ = exc
                outcome = failure
            done = time.perf_counter()
            for index, request in enumerate(batch):
                self._latency.observe(done - request.queued_at)
                result = outcome if isinstance(outcome, BaseException) else outcome[index]
                with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                    request.loop.call_soon_threadsafe(_settle, request.future, result)


def _settle(future: asyncio.Future[float], result: float | BaseException) -> None:
    if future.done():  # the session stopped waiting
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
