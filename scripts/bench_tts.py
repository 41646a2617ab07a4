"""Real-time factor of the cascade's synthesisers, side by side, and whether
Whisper tiny.en hears their words back.

    .venv/bin/python scripts/bench_tts.py [SPEC ...]    (default: espeak piper)

SPEC is a ``--tts`` value. Each synthesiser says the same sentences once to
warm up, then each sentence is timed alone; RTF is synthesis time over the
audio's length (lower is faster; 1.0 is real time). The words are heard by
the default recogniser when its package is installed.
"""

from __future__ import annotations

import re
import sys
import time

from duplex_server.audio import resample_pcm16
from duplex_server.engine.audio.whisper_ct2 import WhisperCt2, packaged_model_path
from duplex_server.models.cascade.model import VOICES
from duplex_server.models.cascade.stages import build_synthesiser

SENTENCES = [
    "You said: what is the capital of Spain.",
    "The weather should be sunny and warm tomorrow afternoon.",
    "Please remind me to call my sister this evening.",
    "Can you recommend a good book to read on a long train journey?",
    "I would like a table for two at seven o'clock tonight.",
]
VOICE = VOICES["alloy"]  # as the cascade maps the OpenAI name


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def main(specs: list[str]) -> None:
    model = packaged_model_path()
    whisper = WhisperCt2(model) if model is not None else None
    for spec in specs:
        tts = build_synthesiser(spec)
        tts.synthesize(SENTENCES[0], VOICE, 1.0)  # warm up
        synth_s = audio_s = 0.0
        misheard = []
        for sentence in SENTENCES:
            started = time.perf_counter()
            pcm = tts.synthesize(sentence, VOICE, 1.0)
            synth_s += time.perf_counter() - started
            audio_s += len(pcm) / 2 / tts.sample_rate_hz
            if whisper is not None:
                heard = whisper.transcribe(resample_pcm16(pcm, tts.sample_rate_hz, 16_000))
                if words(heard) != words(sentence):
                    misheard.append(heard)
        line = (
            f"{spec:10} RTF {synth_s / audio_s:.3f}  ({synth_s:.2f} s to say {audio_s:.1f} s"
            f" in {len(SENTENCES)} sentences)"
        )
        if whisper is not None:
            right = len(SENTENCES) - len(misheard)
            line += f"  heard back word for word: {right}/{len(SENTENCES)}"
        print(line, flush=True)
        for heard in misheard:
            print(f"    misheard as: {heard}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["espeak", "piper"])
