"""Speech recognition with PocketSphinx and the en-US model in its wheel.

One decoder serves every session, one utterance at a time, in a worker
process of its own (:class:`SphinxWorker`): PocketSphinx holds the GIL while
it decodes, so on a thread it would stall the event loop. An utterance is
decoded in one pass over its audio; ``phrases`` switch the decoder from the
open language model to a grammar of those phrases, which is both far more accurate and about forty
times faster when the vocabulary is known (tests, command sets).
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

from pocketsphinx import Decoder

from duplex_server.engine.audio.worker_process import shared_worker

SAMPLE_RATE_HZ = 16_000
# Trailing silence lets the decoder close the last word of an utterance cut
# right at its end (a VAD stop or a client commit).
_TAIL = b"\0\0" * (SAMPLE_RATE_HZ * 3 // 10)


def _grammar(phrases: list[str]) -> str:
    cleaned = [" ".join(re.findall(r"[a-z']+", p.lower())) for p in phrases]
    alternatives = " | ".join(sorted({p for p in cleaned if p}))
    return f"#JSGF V1.0;\ngrammar phrases;\npublic <phrase> = {alternatives} ;\n"


LANGUAGES = frozenset({"en"})
TAKES_PROMPT = False


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

    def transcribe(
        self, pcm16: bytes, language: str | None = None, prompt: str | None = None
    ) -> str:
        """The words in ``pcm16`` (mono, 16 kHz); '' when none were heard.
        English only, and no prompt: the session refuses both hints before
        they reach here (``LANGUAGES``, ``TAKES_PROMPT``)."""
        if not pcm16:
            return ""
        self._decoder.start_utt()
        self._decoder.process_raw(_TAIL + pcm16 + _TAIL, False, True)
        self._decoder.end_utt()
        hypothesis = self._decoder.hyp()
        return hypothesis.hypstr.strip() if hypothesis is not None else ""


class SphinxWorker:
    """:class:`Sphinx` behind its worker process, one per phrase list."""

    languages: frozenset[str] | None = LANGUAGES
    takes_prompt = TAKES_PROMPT
    workers = 1  # one decoder, one process

    def __init__(self, phrases: list[str] | None = None) -> None:
        key = ("pocketsphinx", tuple(phrases or ()))
        self._worker = shared_worker(key, functools.partial(Sphinx, list(phrases or ()) or None))
        self.name = "pocketsphinx" + (" (phrases)" if phrases else "")

    def transcribe(
        self, pcm16: bytes, language: str | None = None, prompt: str | None = None
    ) -> str:
        return self._worker.transcribe(pcm16) if pcm16 else ""
