"""Labelled turns for ``bench turns``, cut from the recordings of ``recorded_speech``.

A turn detector is judged against where a turn really ends, and the
recordings do not say where a speaker paused for thought. So the pauses
are made: a recording is cut at a quiet gap between two of its words and a
pause of 0.4-1.2 s is put there (the recording's own noise floor, not
digital silence), and the pieces are joined again. The label is where the
cut was made: every pause inside a turn is mid-turn, and the turn ends
where its recording's speech ends (``recorded_speech.speech_end_s``). No
model says where a turn ends; the seed says where the cuts fall.

Half the turns have such pauses (one, or two in a sentence of 4 s or more);
the other half are recordings as they are, ending cleanly. The reading
(two LibriVox sentences joined by ``recorded_speech``) keeps its own
0.6 s gap between the sentences: a natural mid-turn pause.

For the backchannel phase: short acknowledgements, each the first word of
a recording ("five", "four", "ten"...: the recordings hold no "mm-hm"), and
real interruptions, whole sentences.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from duplex_bench.recorded_speech import FRAME_MS, SAMPLE_RATE_HZ, Utterance

PAUSE_MS = (400, 1200)  # an inserted pause lasts this long, in FRAME_MS steps
# A gap is this far under the recording's loudest frame, and lasts this long:
# between two words, not a stop consonant inside one.
GAP_BELOW_PEAK_DB = 25.0
GAP_MIN_MS = 60
# No cut this close to the speech's start or end: a pause there is not mid-sentence.
CUT_MARGIN_MS = (500, 600)
TWO_PAUSES_FROM_S = 4.0
CUT_APART_MS = 1000  # two pauses in one turn have at least this much speech between them
# The order turns take their recordings in: short ones first, so a tiny run
# (the test's) is short; the seed moves the cuts, not the order.
PAUSED_SOURCES = (
    "go_forward",
    "three_cards",
    "four_queen",
    "cold_hearted",
    "amiable_woman",
    "reading",
)
CLEAN_SOURCES = (
    "ten_of_clubs",
    "amiable_himself",
    "seven_of_clubs",
    "cold_hearted",
    "four_queen",
    "amiable_woman",
    "five_five",
    "three_cards",
    "reading",
    "go_forward",
)
ACK_SOURCES = ("five_five", "four_queen", "ten_of_clubs", "seven_of_clubs", "three_cards")
ACK_MAX_MS = 600
INTERRUPTION_SOURCES = ("go_forward", "amiable_himself", "three_cards", "cold_hearted")
QUESTION = "go_forward"  # what each backchannel session asks before its answer is talked over

_STEP = SAMPLE_RATE_HZ * FRAME_MS // 1000  # samples per frame
_FRAME_BYTES = 2 * _STEP


@dataclass(frozen=True)
class LabelledTurn:
    """One turn to stream: 16 kHz pcm16, and where its pauses and its end are (ms into it)."""

    name: str
    source: str
    pcm16: bytes
    pauses: tuple[tuple[float, float], ...]  # (start, end) of each inserted pause
    speech_end_ms: float

    @property
    def paused(self) -> bool:
        return bool(self.pauses)

    @property
    def seconds(self) -> float:
        return len(self.pcm16) / 2 / SAMPLE_RATE_HZ

    def report(self) -> dict:
        return {
            "name": self.name,
            "pauses_ms": [[round(a), round(b)] for a, b in self.pauses],
            "speech_end_ms": round(self.speech_end_ms),
        }


def _levels_db(pcm16: bytes) -> np.ndarray:
    samples = np.frombuffer(pcm16, "<i2").astype(np.float64)
    frames = samples[: len(samples) // _STEP * _STEP].reshape(-1, _STEP)
    return 20 * np.log10(np.sqrt((frames**2).mean(axis=1)) + 1.0)


def quiet_runs(pcm16: bytes) -> list[tuple[int, int]]:
    """``(first, count)`` frames of every gap between the first and last loud frame."""
    level = _levels_db(pcm16)
    quiet = level < level.max() - GAP_BELOW_PEAK_DB
    loud = np.flatnonzero(~quiet)
    runs: list[tuple[int, int]] = []
    frame = int(loud[0]) if len(loud) else 0
    last = int(loud[-1]) if len(loud) else 0
    while frame < last:
        if not quiet[frame]:
            frame += 1
            continue
        end = frame
        while end < last and quiet[end]:
            end += 1
        runs.append((frame, end - frame))
        frame = end
    return runs


def cut_points_ms(utterance: Utterance) -> list[float]:
    """Mid-gap instants where a pause may be cut in."""
    first, margin_end = CUT_MARGIN_MS
    runs = quiet_runs(utterance.pcm16)
    onset = _onset_frame(utterance.pcm16) * FRAME_MS
    points = []
    for start, count in runs:
        if count * FRAME_MS < GAP_MIN_MS:
            continue
        at = (start + count / 2) * FRAME_MS
        if onset + first <= at <= utterance.speech_end_s * 1000 - margin_end:
            points.append(at)
    return points


def _onset_frame(pcm16: bytes) -> int:
    level = _levels_db(pcm16)
    loud = np.flatnonzero(level >= level.max() - GAP_BELOW_PEAK_DB)
    return int(loud[0]) if len(loud) else 0


def _noise_floor(pcm16: bytes, ms: int) -> bytes:
    """``ms`` of the recording's quietest frame, repeated: room noise, not zeros."""
    level = _levels_db(pcm16)
    quietest = int(np.argmin(level))
    frame = pcm16[quietest * _FRAME_BYTES : (quietest + 1) * _FRAME_BYTES]
    return frame * (ms // FRAME_MS)


def with_pauses(utterance: Utterance, cuts: list[tuple[float, int]]) -> LabelledTurn:
    """The recording with a pause of ``ms`` cut in at each ``(at_ms, ms)``."""
    pieces, pauses, shift, taken = [], [], 0.0, 0
    for at_ms, ms in sorted(cuts):
        at = int(at_ms / FRAME_MS) * _FRAME_BYTES
        pieces.append(utterance.pcm16[taken:at])
        pieces.append(_noise_floor(utterance.pcm16, ms))
        start = at / 2 / SAMPLE_RATE_HZ * 1000 + shift
        pauses.append((start, start + ms))
        shift += ms
        taken = at
    pieces.append(utterance.pcm16[taken:])
    name = utterance.name + "".join(
        f"+{ms}ms@{int(at / FRAME_MS) * FRAME_MS}" for at, ms in sorted(cuts)
    )
    return LabelledTurn(
        name, utterance.name, b"".join(pieces), tuple(pauses), utterance.speech_end_s * 1000 + shift
    )


def build(utterances: list[Utterance], turns: int, seed: int) -> list[LabelledTurn]:
    """``turns`` labelled turns: even ones paused, odd ones clean."""
    rng = random.Random(seed)
    named = {u.name: u for u in utterances}
    built = []
    for index in range(turns):
        if index % 2:
            built.append(with_pauses(named[CLEAN_SOURCES[index // 2 % len(CLEAN_SOURCES)]], []))
            continue
        utterance = named[PAUSED_SOURCES[index // 2 % len(PAUSED_SOURCES)]]
        points = cut_points_ms(utterance)
        count = 2 if utterance.speech_end_s >= TWO_PAUSES_FROM_S and len(points) > 1 else 1
        chosen: list[float] = []
        for point in rng.sample(points, len(points)):
            if len(chosen) < count and all(abs(point - c) >= CUT_APART_MS for c in chosen):
                chosen.append(point)
        chosen.sort()
        low, high = PAUSE_MS
        lengths = [rng.randrange(low, high + 1, FRAME_MS) for _ in chosen]
        built.append(with_pauses(utterance, list(zip(chosen, lengths, strict=True))))
    return built


def acknowledgement(utterance: Utterance) -> Utterance:
    """The recording's first word: from its onset to its first gap, at most ``ACK_MAX_MS``."""
    onset = _onset_frame(utterance.pcm16)
    end = onset + ACK_MAX_MS // FRAME_MS
    for start, count in quiet_runs(utterance.pcm16):
        if start > onset + 150 // FRAME_MS and count * FRAME_MS >= GAP_MIN_MS:
            end = min(end, start)
            break
    lead = max(0, onset - 2)
    pcm = utterance.pcm16[lead * _FRAME_BYTES : (end + 2) * _FRAME_BYTES]
    word = utterance.reference.split()[0]
    return Utterance(f"ack:{word}", word, pcm, (end - lead) * FRAME_MS / 1000)


def acknowledgements(utterances: list[Utterance]) -> list[Utterance]:
    named = {u.name: u for u in utterances}
    return [acknowledgement(named[name]) for name in ACK_SOURCES]


def interruptions(utterances: list[Utterance]) -> list[Utterance]:
    named = {u.name: u for u in utterances}
    return [named[name] for name in INTERRUPTION_SOURCES]


def question(utterances: list[Utterance]) -> Utterance:
    return next(u for u in utterances if u.name == QUESTION)
