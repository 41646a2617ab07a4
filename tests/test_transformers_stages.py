"""Whisper and VITS stages on tiny checkpoints built locally."""

from __future__ import annotations

import numpy as np
import pytest

from duplex_server.engine.audio.transformers_models import VitsTts, WhisperAsr
from tests.speech import speak
from tests.tiny_models import tiny_vits, tiny_whisper


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return tiny_whisper(root / "whisper"), tiny_vits(root / "vits")


def test_whisper_transcribes_through_the_checkpoint(checkpoints):
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    whisper, _ = checkpoints
    speech = speak("open the door", 16_000)
    heard = WhisperAsr(str(whisper)).transcribe(speech)
    # The same answer as the checkpoint gives when driven directly.
    processor = WhisperProcessor.from_pretrained(whisper)
    model = WhisperForConditionalGeneration.from_pretrained(whisper).eval()
    audio = np.frombuffer(speech, "<i2").astype(np.float32) / 32768.0
    features = processor(audio, sampling_rate=16_000, return_tensors="pt").input_features
    with torch.inference_mode():
        ids = model.generate(features, max_new_tokens=96)
    assert heard == processor.batch_decode(ids, skip_special_tokens=True)[0].strip()
    assert WhisperAsr(str(whisper)).transcribe(b"") == ""


def test_vits_speaks_and_speed_shortens(checkpoints):
    _, vits = checkpoints
    tts = VitsTts(str(vits))
    assert tts.sample_rate_hz == 16_000
    normal = tts.synthesize("you said hello.")
    fast = tts.synthesize("you said hello.", speed=2.0)
    assert len(normal) > 0 and np.abs(np.frombuffer(normal, "<i2")).max() > 0
    assert len(fast) < len(normal)


def test_a_directory_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        WhisperAsr(str(tmp_path))
    with pytest.raises(ValueError, match="config.json"):
        VitsTts(str(tmp_path))
