"""Local transformers checkpoints as cascade stages: Whisper for speech
recognition (``--asr whisper:PATH``) and VITS / MMS-TTS for synthesis
(``--tts vits:PATH``). Checkpoints load from a directory, never from a hub;
torch and transformers come with the ``ml`` extra and are imported here only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ASR_RATE_HZ = 16_000
MAX_NEW_TOKENS = 96


def _import_ml() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise RuntimeError(
            "this stage needs torch and transformers: pip install -e '.[ml]'"
        ) from exc
    return torch, transformers


def _checkpoint(path: str) -> Path:
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ValueError(f"{path}: not a checkpoint directory (no config.json)")
    return directory


class WhisperAsr:
    """Any local Whisper checkpoint; transcribes 16 kHz pcm16. A checkpoint
    whose generation config maps languages is told the session's language;
    one without (English-only, and the tests' tiny models) hears English.
    No prompts: the session refuses them (``takes_prompt``)."""

    takes_prompt = False
    workers = 1  # generate() on one model is not run from two threads

    def __init__(self, path: str) -> None:
        torch, transformers = _import_ml()
        directory = _checkpoint(path)
        self._torch = torch
        self._processor = transformers.WhisperProcessor.from_pretrained(directory)
        model = transformers.WhisperForConditionalGeneration.from_pretrained(directory)
        self._model = model.eval()
        mapped = getattr(model.generation_config, "lang_to_id", None)
        self.languages: frozenset[str] | None = None if mapped else frozenset({"en"})
        self.name = f"whisper:{directory}"

    def transcribe(
        self, pcm16: bytes, language: str | None = None, prompt: str | None = None
    ) -> str:
        if not pcm16:
            return ""
        options = {"language": language} if language and self.languages is None else {}
        audio = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
        features = self._processor(
            audio, sampling_rate=ASR_RATE_HZ, return_tensors="pt"
        ).input_features
        with self._torch.inference_mode():
            ids = self._model.generate(features, max_new_tokens=MAX_NEW_TOKENS, **options)
        return self._processor.batch_decode(ids, skip_special_tokens=True)[0].strip()


class VitsTts:
    """A local VITS / MMS-TTS checkpoint; one speaker, ``speed`` honoured."""

    def __init__(self, path: str) -> None:
        torch, transformers = _import_ml()
        directory = _checkpoint(path)
        self._torch = torch
        self._tokenizer = transformers.VitsTokenizer.from_pretrained(directory)
        self._model = transformers.VitsModel.from_pretrained(directory).eval()
        self.sample_rate_hz = int(self._model.config.sampling_rate)

    def knows_voice(self, voice: str) -> bool:
        """One speaker per checkpoint: every voice name maps onto it."""
        return True

    def synthesize(self, text: str, voice: str = "", speed: float = 1.0) -> bytes:
        """pcm16 of ``text``; ``voice`` is ignored (one speaker per checkpoint)."""
        inputs = self._tokenizer(text, return_tensors="pt")
        with self._torch.inference_mode():
            waveform = self._model(**inputs, speaking_rate=speed).waveform[0].numpy()
        return (np.clip(waveform, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()

    def synthesize_seeded(self, text: str, voice: str, speed: float, seed: int) -> bytes:
        """:meth:`synthesize` with the sampler's noise drawn from ``seed``:
        VITS samples its durations and its prior with ``torch.randn`` on
        torch's global generator (transformers takes no generator), so the
        call runs on a forked copy of that generator, seeded, and leaves it
        as it was. The same seed, text, voice and speed give the same
        samples, provided nothing else in the process draws from torch's
        global CPU generator meanwhile (here: calls are serialised on the TTS
        stage's one thread, and the other torch users own their generators)."""
        with self._torch.random.fork_rng(devices=[]):
            self._torch.manual_seed(seed)
            return self.synthesize(text, voice, speed)
