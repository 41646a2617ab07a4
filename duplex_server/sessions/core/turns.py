"""Server VAD turn-taking: speech probabilities in, speech start/stop out.

Pure: the scores come from a model's voice-activity stage, the times are on
the session's input timeline (milliseconds of all audio written), and the
gate holds no clock. The decisions it makes are logged; the gate itself is
a cache that a restored session starts afresh.

Under ``semantic_vad`` silence alone does not end a turn: a pause of
``silence_duration_ms`` asks an end-of-turn model (``speech_paused``), whose
probability, against the eagerness's threshold, ends the turn or keeps it
open (:func:`turn_finished`); the eagerness's longest wait ends it anyway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from msgspec import UnsetType

from protocol.session_config import TurnDetection

# A start needs this much speech in a row: a click or a breath is not a turn
# (``turn_detection.min_speech_duration_ms`` sets it per session).
MIN_SPEECH_MS = 64.0
# Speech over the assistant longer than this is a barge-in; shorter is a
# remark ("mm-hm") that the assistant talks through (the default of the
# session's ``overlap_barge_in_ms``).
BARGE_IN_MS = 400.0
# Sustained speech over the assistant whose words, once the recogniser has
# heard them, are all acknowledgements ("mm-hm", "okay", "yeah right") does
# not cut the answer either, if it ends within this long (eSpeak's "mm-hm"
# lasts 780 ms, "okay okay" 720 ms); longer, it is a barge-in whatever its
# words. The server's ``--backchannel-max-ms`` sets it.
BACKCHANNEL_MAX_MS = 1000.0
# The acknowledgements (``--backchannel-words``): single words, compared
# without case, hyphens or apostrophes ("Mm-hmm." is "mmhmm"); a phrase in
# the list ("got it") adds each of its words.
BACKCHANNEL_WORDS = (
    "mm-hm,mm-hmm,mhm,hm,hmm,mm,uh-huh,uh,um,ah,oh,yeah,yep,yes,yup,ok,okay,right,"
    "alright,sure,i see,got it,cool,nice,great,wow,true,exactly,indeed,totally"
)


@dataclass(frozen=True)
class Eagerness:
    """What a ``semantic_vad`` eagerness means: the pause after speech that
    asks the end-of-turn model (the session's ``silence_duration_ms`` unless
    the client set one), the probability of "finished" that ends the turn,
    and the longest pause that ends it whatever the model said."""

    ask_after_ms: int
    threshold: float
    longest_wait_ms: int


# OpenAI's eagerness: "low" lets the user take their time (its longest waits
# are OpenAI's documented 8, 4 and 2 s); "high" answers soon.
EAGERNESS = {
    "low": Eagerness(ask_after_ms=500, threshold=0.7, longest_wait_ms=8000),
    "medium": Eagerness(ask_after_ms=300, threshold=0.5, longest_wait_ms=4000),
    "auto": Eagerness(ask_after_ms=300, threshold=0.5, longest_wait_ms=4000),
    "high": Eagerness(ask_after_ms=200, threshold=0.3, longest_wait_ms=2000),
}


def eagerness_of(settings: TurnDetection) -> Eagerness | None:
    """The eagerness a ``semantic_vad`` session's turns end by; None under
    ``server_vad`` (silence alone ends its turns)."""
    if settings.type != "semantic_vad":
        return None
    named = settings.eagerness
    return EAGERNESS["auto" if isinstance(named, UnsetType) else named]


def turn_finished(probability: float, eagerness: Eagerness) -> bool:
    """The end-of-turn model's word at a pause: the turn is over."""
    return probability >= eagerness.threshold


@dataclass(frozen=True)
class Transition:
    # speech_sustained: the speech has lasted BARGE_IN_MS (once per utterance);
    # speech_long: it has lasted the gate's long_ms (once, after sustained);
    # speech_paused (semantic_vad): a pause long enough to ask the end-of-turn
    # model, once per pause, the speech going on until the model ends it.
    kind: Literal[
        "speech_started", "speech_sustained", "speech_long", "speech_paused", "speech_stopped"
    ]
    at_ms: float  # start of the speech, end of the last speech window, or now


class VadGate:
    def __init__(
        self,
        settings: TurnDetection,
        window_ms: float,
        barge_in_ms: float = BARGE_IN_MS,
        long_ms: float | None = None,
    ) -> None:
        self.barge_in_ms = barge_in_ms
        # speech_long: the speech has lasted this (once per utterance; None: never)
        self.long_ms = long_ms
        self.threshold = float(settings.threshold)  # type: ignore[arg-type]  # merged: always set
        self.silence_ms = float(settings.silence_duration_ms)  # type: ignore[arg-type]  # merged: set
        # semantic_vad: the pause asks the model; only the longest wait stops.
        self.pause_ms: float | None = None
        if (eagerness := eagerness_of(settings)) is not None:
            self.pause_ms = self.silence_ms
            self.silence_ms = max(float(eagerness.longest_wait_ms), self.pause_ms)
        self._paused = False  # this pause was reported
        shortest = settings.min_speech_duration_ms
        self.min_speech_ms = MIN_SPEECH_MS if isinstance(shortest, UnsetType) else float(shortest)
        self.window_ms = window_ms
        self.speaking = False
        self._run_start: float | None = None  # first window of a run of speech
        self._last_speech_end = 0.0
        self._sustained = False
        self._long = False

    @property
    def last_speech_end_ms(self) -> float:
        """Where the speech going on was last heard (its end, once it stops)."""
        return self._last_speech_end

    def push(self, end_ms: float, probability: float) -> list[Transition]:
        """One scored window ending at ``end_ms``; the transitions it causes."""
        start_ms = end_ms - self.window_ms
        voiced = probability >= self.threshold
        if not self.speaking:
            if not voiced:
                self._run_start = None
                return []
            if self._run_start is None:
                self._run_start = start_ms
            if end_ms - self._run_start < self.min_speech_ms:
                return []
            self.speaking = True
            self._sustained = self._long = False
            self._last_speech_end = end_ms
            return [Transition("speech_started", self._run_start)]
        if voiced:
            self._last_speech_end = end_ms
            self._paused = False
            assert self._run_start is not None
            lasted_ms = end_ms - self._run_start
            if not self._sustained and lasted_ms >= self.barge_in_ms:
                self._sustained = True
                return [Transition("speech_sustained", end_ms)]
            if self.long_ms is not None and not self._long and lasted_ms >= self.long_ms:
                self._long = True
                return [Transition("speech_long", end_ms)]
            return []
        silent_ms = end_ms - self._last_speech_end
        if silent_ms < self.silence_ms:
            if self.pause_ms is None or self._paused or silent_ms < self.pause_ms:
                return []
            self._paused = True
            return [Transition("speech_paused", self._last_speech_end)]
        return [self.stop()]

    def stop(self) -> Transition:
        """The speech is over (its silence lasted, or the end-of-turn model
        said the turn is finished): the next speech is a new utterance."""
        self.speaking = False
        self._run_start = None
        self._paused = False
        return Transition("speech_stopped", self._last_speech_end)


OverlapAction = Literal["drop", "listen", "barge_in"]


@dataclass
class HintedOverlap:
    """Speech over the answer without server VAD: each chunk is speech by the
    client's word (``is_speech``, ``speech_probability``) or, with neither, by
    its energy; the client may also force the decision. Pure, like the gate:
    its decisions are logged, it is a cache a restored session starts afresh.

    Speech that ends before ``short_ack_ms`` is dropped (a remark), speech
    that ends later is listened to, speech that lasts ``barge_in_ms`` takes
    the floor (``barge_in``, or ``listen`` where the policy or the model says
    the answer goes on)."""

    short_ack_ms: float
    barge_in_ms: float
    response_id: str = ""
    run_ms: float = 0.0
    decided: bool = False

    def push(
        self,
        response_id: str,
        duration_ms: float,
        speech: bool,
        forced: OverlapAction | None,
        may_barge_in: bool,
    ) -> tuple[OverlapAction, float] | None:
        """One chunk heard while ``response_id`` plays; a decision, if it made one."""
        if response_id != self.response_id:
            self.response_id, self.run_ms, self.decided = response_id, 0.0, False
        if speech:
            self.run_ms += duration_ms
        if forced is not None and not self.decided:
            self.decided = True
            return forced, self.run_ms
        if self.decided or not self.run_ms:
            if not speech:
                self.run_ms, self.decided = 0.0, False  # the next speech is a new overlap
            return None
        if speech and self.run_ms >= self.barge_in_ms:
            self.decided = True
            return ("barge_in" if may_barge_in else "listen"), self.run_ms
        if speech:
            return None
        overlap_ms, self.run_ms = self.run_ms, 0.0
        return ("drop" if overlap_ms < self.short_ack_ms else "listen"), overlap_ms


@dataclass
class Overlap:
    """Speech that began while the assistant was speaking, until it is resolved
    (``barge_in`` or ``listen`` once sustained; a ``drop`` if it stops first).
    ``held``: it was sustained, and the decision waits for its words (a
    backchannel, :func:`overlap_verdict`); ``words``: the newest transcript
    of it, once the recogniser has heard it, of the input up to
    ``heard_until_ms``."""

    started_ms: float
    response_id: str
    action: Literal["barge_in", "listen"] | None = None
    held: bool = False
    words: str | None = None
    heard_until_ms: float = 0.0
    reason: str = ""  # a drop's, once its end settled it (backchannel_words)


# Why an overlap was decided as it was: the ``reason`` of its logged
# ``overlap.decision`` (and of the duplex wire's event).
OverlapReason = Literal[
    "short_overlap",  # drop: it ended before overlap_barge_in_ms
    "backchannel_words",  # drop: sustained, but short and all acknowledgements
    "speech_over_answer",  # barge_in: sustained, no words asked (no recogniser or list)
    "not_a_backchannel",  # barge_in / listen: its words are not all acknowledgements
    "too_long",  # barge_in / listen: longer than a backchannel, whatever its words
    "unheard",  # barge_in / listen: it ended with its words still unknown
    "speech_started",  # barge_in: OpenAI's endpoint cuts when speech starts
    "listen_only",  # listen: the policy or interrupt_response keeps the answer going
    "answer_ended",  # listen: the answer ended while the words were awaited
]

Verdict = Literal["hold", "backchannel", "speech"]


@dataclass(frozen=True)
class Backchannels:
    """Which sustained speech over the answer is an acknowledgement: at most
    ``max_ms`` long and every word of it in ``words`` (normalised by
    :func:`normal_words`). No words: the rule is off (length alone decides)."""

    words: frozenset[str]
    max_ms: float = BACKCHANNEL_MAX_MS

    @classmethod
    def parse(cls, listed: str, max_ms: float = BACKCHANNEL_MAX_MS) -> Backchannels:
        """From the comma-separated setting (``--backchannel-words``)."""
        return cls(frozenset(normal_words(listed.replace(",", " "))), max_ms)

    @property
    def enabled(self) -> bool:
        return bool(self.words)

    def all_backchannel(self, text: str) -> bool | None:
        """Whether every word of ``text`` is an acknowledgement; None: no words."""
        heard = normal_words(text)
        if not heard:
            return None
        return all(word in self.words for word in heard)


_NOT_A_WORD = re.compile(r"[^a-z0-9'\-]+")


def normal_words(text: str) -> list[str]:
    """``text``'s words, lower case, hyphens and apostrophes dropped
    ("Mm-hmm, OK." is ``["mmhmm", "ok"]``)."""
    words = (w.replace("-", "").replace("'", "") for w in _NOT_A_WORD.split(text.lower()))
    return [w for w in words if w]


def overlap_verdict(
    rule: Backchannels, overlap_ms: float, words: str | None, ended: bool
) -> tuple[Verdict, OverlapReason | None]:
    """Sustained speech over the answer, ``overlap_ms`` long so far (or in
    all, once ``ended``), its words ``words`` if heard: ``hold`` (wait for
    its words or its end), ``backchannel`` (the answer goes on) or
    ``speech`` (as today: a barge-in, or a listen under the policy). Words
    that are not all acknowledgements decide at once, and so does a decode
    with no words in it; so does a length past ``rule.max_ms``; speech that
    ends unheard is speech (the length decides)."""
    heard = rule.all_backchannel(words) if words is not None else None
    if heard is False:
        return "speech", "not_a_backchannel"
    if words is not None and heard is None:
        # decoded, and no word in it: the recogniser heard no acknowledgement
        # (a phrase grammar hears nothing of a phrase begun) - speech, now
        return "speech", "unheard"
    if overlap_ms >= rule.max_ms:
        return "speech", "too_long"
    if not ended:
        return "hold", None
    if heard is None:
        return "speech", "unheard"
    return "backchannel", "backchannel_words"
