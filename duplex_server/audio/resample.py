"""Resampling pcm16 through libsoxr: whole signals, and streams cut into chunks.

A chunk resampled on its own clicks at both ends (its filter sees zeros
past each edge), so a stream keeps one :class:`StreamResampler` across its
chunks. soxr's own ``ResampleStream`` holds output back in blocks, 18-171
ms (measured at HQ in 20 ms chunks; docs/decisions/audio-resampling.md), which a live voice
cannot wait for and which a response that ends without a flush would lose;
this one holds back only the filter's reach (2-12 ms by pair of rates) by
running soxr's one-shot resampler over a window that keeps that much input
on each side of the samples it emits.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import soxr

QUALITY = "HQ"  # 20-bit, passband to 91 % of the lower Nyquist frequency
# A filter tap weighs in the stream if above this fraction of the peak (-120 dB).
_REACH_FLOOR = 1e-6


def resample_pcm16(pcm: bytes, src_hz: int, dst_hz: int) -> bytes:
    """A whole signal (silence before and after it), ``round(n * dst / src)`` samples."""
    if src_hz == dst_hz or not pcm:
        return pcm
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    out = soxr.resample(samples, src_hz, dst_hz, quality=QUALITY)
    count = max(1, round(len(samples) * dst_hz / src_hz))
    out = np.pad(out[:count], (0, max(0, count - len(out))))
    return _to_pcm16(out)


def _to_pcm16(samples: np.ndarray) -> bytes:
    return np.clip(np.round(samples), -32768, 32767).astype("<i2").tobytes()


@functools.lru_cache(maxsize=256)
def filter_reach(src_hz: int, dst_hz: int) -> int:
    """Input samples on each side of an output sample that weigh in it: an
    impulse's response, measured once per pair of rates."""
    length = src_hz // 5  # 200 ms: wider than any HQ filter
    impulse = np.zeros(length, dtype=np.float32)
    impulse[length // 2] = 1.0
    response = np.abs(soxr.resample(impulse, src_hz, dst_hz, quality=QUALITY))
    heard = np.nonzero(response > _REACH_FLOOR * response.max())[0]
    centre = length // 2 * dst_hz / src_hz
    reach_out = max(centre - heard[0], heard[-1] - centre)
    return math.ceil(reach_out * src_hz / dst_hz) + 1


class StreamResampler:
    """One stream's resampler: pcm16 chunks in, pcm16 chunks out, no seams.

    Every push returns exactly the samples its input is due at the new rate
    (the running total is ``floor(inputs * dst / src)``), so a chunk's
    length still says its duration; the stream starts with :attr:`delay`
    samples of silence, the lookahead the filter needs. :meth:`flush` ends
    the signal (the delayed tail) and starts afresh; :meth:`reset` drops it.
    """

    def __init__(self, src_hz: int, dst_hz: int) -> None:
        self.src_hz = src_hz
        self.dst_hz = dst_hz
        common = math.gcd(src_hz, dst_hz)
        # A window starts on a multiple of this many inputs, so its outputs
        # fall on the stream's own output grid.
        self._period = src_hz // common
        self._reach = 0 if src_hz == dst_hz else filter_reach(src_hz, dst_hz)
        # Output samples the stream lags its input by.
        self.delay = 0 if src_hz == dst_hz else math.ceil(self._reach * dst_hz / src_hz) + 1
        self.reset()

    def reset(self) -> None:
        """A fresh signal: nothing heard, nothing owed."""
        self._window = np.zeros(0, dtype=np.float32)
        self._window_start = 0  # input index of the window's first sample
        self._inputs = 0
        self._made = 0  # resampled outputs emitted (after the lead-in)
        self._sent = 0  # outputs emitted, lead-in included

    def push(self, pcm16: bytes) -> bytes:
        """The resampled audio this chunk completes, ``delay`` samples late."""
        if self.src_hz == self.dst_hz:
            return pcm16
        samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float32)
        self._window = np.concatenate([self._window, samples])
        self._inputs += len(samples)
        due = self._inputs * self.dst_hz // self.src_hz
        return self._emit(due, max(self._made, due - self.delay))

    def flush(self) -> bytes:
        """The rest of the signal, as if it ended here (silence after it);
        the stream then starts afresh."""
        if self.src_hz == self.dst_hz or not self._inputs:
            return b""
        due = self._inputs * self.dst_hz // self.src_hz
        tail = self._emit(due + self.delay, due)
        self.reset()
        return tail

    def _emit(self, due: int, made: int) -> bytes:
        lead = max(0, min(due, self.delay) - min(self._sent, self.delay))
        parts = [np.zeros(lead, dtype=np.float32)]
        if made > self._made:
            out = soxr.resample(self._window, self.src_hz, self.dst_hz, quality=QUALITY)
            first = self._window_start * self.dst_hz // self.src_hz  # exact: on the grid
            parts.append(out[self._made - first : made - first])
            self._made = made
            self._drop_heard()
        pcm = _to_pcm16(np.concatenate(parts))
        self._sent += len(pcm) // 2
        return pcm

    def _drop_heard(self) -> None:
        """Keep only the input the next outputs still reach back to."""
        oldest = (self._made * self.src_hz - self._reach * self.dst_hz) // self.dst_hz
        start = max(self._window_start, oldest // self._period * self._period)
        self._window = self._window[start - self._window_start :]
        self._window_start = start
