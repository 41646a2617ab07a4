"""Speech recognition with PocketSphinx and the en-US model in its wheel.

One decoder serves every session, one utterance at a time (the caller runs it
on the ASR stage's thread). An utterance is decoded in one pass over its
audio; ``phrases`` switch the decoder from the open language model to a
grammar of those phrases, which is both far more accurate and about forty
times faster when the vocabulary is known (tests, command sets).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from pocketsphinx import Decoder

SAMPLE_RATE_HZ = 16_000
# Trailing silence lets the decoder close the last word of an utterance cut
# right at its end (a VAD stop or a client commit).
_TAIL = b"\0\0" * (SAMPLE_RATE_HZ * 3 // 10)


def _grammar(phrases: list[str]) -> str:
    cleaned = [" ".join(re.findall(r"[a-z']+", p.lower())) for p in phrases]
    alternatives = " | ".join(sorted({p for p in cleaned if p}))
    return f"#JSGF V1.0;\ngrammar phrases;\npublic <phrase> = {alternatives} ;\n"


class Sphinx:
    def __init__(self, phrases: list[str] | None = None) -> None:
        self._decoder = Decoder(samprate=SAMPLE_RATE_HZ, loglevel="FATAL")
        self.vocabulary = "phrases" if phrases else "open"
        if phrases:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "phrases.gram"
                path.write_text(_grammar(phrases))
                self._decoder.add_jsgf_file("phrases", str(path))
            self._decoder.activate_search("phrases")

    def transcribe(self, pcm16: bytes) -> str:
        """The words in ``pcm16`` (mono, 16 kHz); '' when none were heard."""
        if not pcm16:
            return ""
        self._decoder.start_utt()
        self._decoder.process_raw(_TAIL + pcm16 + _TAIL, False, True)
        self._decoder.end_utt()
        hypothesis = self._decoder.hyp()
        return hypothesis.hypstr.strip() if hypothesis is not None else ""
