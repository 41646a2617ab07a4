"""What the session actor needs from a model, and nothing more.

Model adapters (``duplex_server.models``) implement :class:`ModelPort`; the
session core never imports them, so the arrow points from models to here.
Models see the conversation and the settings through the neutral views
defined here (:class:`HistoryItem`, :class:`SessionView`), never the core's
own ``Item`` and ``EffectiveConfig``: the core may change its state freely.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import msgspec

from duplex_server.sessions.core.config import EffectiveConfig
from duplex_server.sessions.core.items import Item, item_text, transcript_at
from protocol.capabilities import Capabilities
from protocol.session_config import Tool, ToolChoice


class FunctionCallPart(msgspec.Struct, frozen=True):
    """A complete tool call the model made (``arguments``: its JSON text).
    It becomes a ``function_call`` item of the response that made it."""

    call_id: str
    name: str
    arguments: str


class ModelChunk(msgspec.Struct):
    """One slice of a response: pcm16 audio at ``sample_rate_hz``, text, and
    a tool call, any of them."""

    audio: bytes = b""
    sample_rate_hz: int = 24_000
    text: str = ""
    function_call: FunctionCallPart | None = None
    # Stage times the model measured for this response so far, in ms
    # (the cascade: ``tts_first_clause_ms`` on its first chunk).
    stage_ms: dict[str, float] | None = None


class HistoryItem(msgspec.Struct, frozen=True):
    """One conversation item as a model sees it."""

    id: str
    kind: str  # message | function_call | function_call_output
    role: str | None  # user | assistant | system; None for tool items
    # What it says: its typed text, or its audio's transcript; an assistant's
    # spoken answer only as far as it counts in history (played and
    # acknowledged, or cut by a truncation), so a model answers what was heard.
    text: str
    audio_ms: float = 0.0  # of its audio, if any (samples in ResponseRequest.audio)
    audio_rate: int = 0
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class SessionView(msgspec.Struct, frozen=True):
    """The settings a response is generated under, as a model sees them."""

    instructions: str
    voice: str
    speed: float
    temperature: float
    max_output_tokens: int | str
    tools: list[Tool]
    tool_choice: ToolChoice
    chunk_delay_ms: float  # echo's pacing knob (extra_body)


def history_view(items: list[Item]) -> list[HistoryItem]:
    return [_history_item(item) for item in items]


def _history_item(item: Item) -> HistoryItem:
    audio = next((part for part in item.parts if part.audio_ms), None)
    return HistoryItem(
        id=item.id,
        kind=item.type,
        role=item.role,
        text=_heard_text(item),
        audio_ms=audio.audio_ms if audio else 0.0,
        audio_rate=audio.audio_rate if audio else 0,
        call_id=item.call_id,
        name=item.name,
        arguments=item.arguments,
        output=item.output,
    )


def _heard_text(item: Item) -> str:
    """An assistant's spoken item up to its ``history_ms`` (by its
    audio-text marks); any other item whole."""
    spoken = item.role == "assistant" and any(part.type == "audio" for part in item.parts)
    if not spoken or item.history_ms is None:
        return item_text(item)
    return transcript_at(item.marks, item_text(item), item.history_ms)


def session_view(config: EffectiveConfig) -> SessionView:
    return SessionView(
        instructions=config.instructions,
        voice=config.voice,
        speed=config.speed,
        temperature=config.temperature,
        max_output_tokens=config.max_output_tokens,
        tools=list(config.tools),
        tool_choice=config.tool_choice,
        chunk_delay_ms=config.chunk_delay_ms,
    )


class ResponseRequest(msgspec.Struct):
    session_id: str
    response_id: str
    epoch: int
    modalities: list[str]
    history: list[HistoryItem]
    config: SessionView
    # pcm16 of recent user items by item id (rate: the item's part.audio_rate)
    audio: dict[str, bytes] = msgspec.field(default_factory=dict)


# --- the streaming port: native full-duplex models -------------------------


class InputUnit(msgspec.Struct, frozen=True):
    """One ``chunk_period_ms`` of the session's input at the model's rate.

    Units are numbered on the session's input timeline from 0. ``silence``
    units were clocked by the server while the client sent nothing, so the
    model keeps time through a pause."""

    index: int
    pcm: bytes  # pcm16 mono at sample_rate_hz
    sample_rate_hz: int
    silence: bool = False


UnitDecision = Literal["listen", "speak", "end_of_turn", "yield"]


class UnitOutput(msgspec.Struct):
    """What the model decided and produced for one unit: a floor decision
    (``speak`` takes the floor, ``end_of_turn`` ends its answer, ``yield``
    gives the floor back mid-answer, ``listen`` keeps listening) and any
    audio (pcm16 at ``sample_rate_hz``), text and tool call it emitted, with
    the stage times it measured (reported on the response's ``response.done``)."""

    decision: UnitDecision | None = None
    audio: bytes = b""
    sample_rate_hz: int = 24_000
    text: str = ""
    function_call: FunctionCallPart | None = None
    stage_ms: dict[str, float] | None = None
    # The model's own output tokens for the unit, as it would be fed them
    # back (teacher forcing): set by a model whose state must survive a
    # crash. The session logs them with the unit (a ``unit`` record).
    tokens: tuple[int, ...] | None = None


class SteppedUnit(msgspec.Struct, frozen=True):
    """A unit the model stepped before, and the tokens it generated then:
    what a model rebuilds its state from when a session is restored."""

    unit: InputUnit
    tokens: tuple[int, ...]


class StreamSetup(msgspec.Struct, frozen=True):
    """What a native duplex model that is primed (``Streaming.primes_at_input``)
    hears before the session's first unit: the session's ``instructions``
    as its persona and its ``voice`` as a voice prompt, and the
    ``temperature`` it samples at (0: greedy), as they stood when the
    session's input began (they are fixed from then on: gates.py)."""

    instructions: str = ""
    voice: str = "default"
    temperature: float = 0.0


def stream_setup(config: EffectiveConfig) -> StreamSetup:
    return StreamSetup(
        instructions=config.instructions, voice=config.voice, temperature=config.temperature
    )


class UnitSession(Protocol):
    """One session's stream into a native duplex model (its state: caches,
    codec state). Steps are called one at a time, in unit order."""

    async def step(self, unit: InputUnit) -> list[UnitOutput]: ...

    def interrupt(self) -> None:
        """The session fenced the model's answer (cancel, barge-in, clear):
        whatever it was saying is over; it listens again."""
        ...

    def close(self) -> None: ...


class Streaming(Protocol):
    """A model that takes every input unit as it arrives and decides per unit
    (Moshi, PersonaPlex, MiniCPM-o): never waits for a commit."""

    sample_rate_hz: int  # of the units it takes
    unit_ms: int  # its chunk_period_ms
    # How many of a session's latest stepped units rebuild its state (its
    # context window); 0 for a model that logs no tokens.
    resume_units: int
    # Its stream opens at the session's first input audio, primed with the
    # session's StreamSetup; before that it hears nothing (no silence is
    # clocked) and says nothing. False: it opens with the session.
    primes_at_input: bool

    def open(
        self, session_id: str, setup: StreamSetup, history: Sequence[SteppedUnit] = ()
    ) -> UnitSession:
        """A session's stream, primed with ``setup``; ``history`` (its latest
        stepped units, oldest first, at most ``resume_units``) makes it
        continue where they left off (after the same priming)."""
        ...


class SpeechScorer(Protocol):
    """One session's voice-activity stream (it carries recurrent state)."""

    window_ms: float

    async def score(self, pcm16: bytes, sample_rate_hz: int) -> list[tuple[float, float]]:
        """(end of window in ms since the stream began, speech probability) per
        window the new audio completed."""
        ...


class TranscriptionError(Exception):
    """The model's recogniser failed on a turn; the session carries on without
    a transcript for it."""


@dataclass(frozen=True)
class TranscriptionHints:
    """What the session's ``input_audio_transcription`` tells the recogniser."""

    language: str | None = None  # ISO-639-1
    prompt: str | None = None  # earlier words, names, a style


NO_HINTS = TranscriptionHints()


class Listening(Protocol):
    """What a model that hears offers the session core (``None`` on models
    that do not): voice activity for ``server_vad``, and a transcript of each
    committed turn."""

    # The languages its recogniser hears (None: any), and whether it takes a
    # prompt; a session.update asking for more is refused.
    transcription_languages: frozenset[str] | None
    transcription_prompts: bool

    def open_scorer(self) -> SpeechScorer: ...

    def can_take_partial(self) -> bool:
        """Whether a partial transcript may run now without delaying final ones."""
        ...

    async def transcribe(
        self,
        pcm16: bytes,
        sample_rate_hz: int,
        partial: bool = False,
        hints: TranscriptionHints = NO_HINTS,
    ) -> str:
        """The words in the audio; ``partial`` for speech still going on (it
        yields to final transcripts). Raises :class:`TranscriptionError`."""
        ...


class TurnModelUnavailable(Exception):
    """The end-of-turn model cannot judge this pause now (its queue is full,
    or it failed): the turn waits for the eagerness's longest wait instead."""


class TurnEnding(Protocol):
    """An end-of-turn model (``semantic_vad``): from the audio of a turn so
    far, trailing pause included, whether the speaker has finished."""

    async def probability(self, pcm16: bytes, sample_rate_hz: int) -> float:
        """The probability that the turn is complete. Raises
        :class:`TurnModelUnavailable`."""
        ...


@runtime_checkable
class EndsTurns(Protocol):
    """A model whose turns ``semantic_vad`` ends with an end-of-turn model
    (None: it has none, and names no ``semantic_vad`` in its
    ``turn_detection_types``)."""

    turn_ending: TurnEnding | None


class Answering(Protocol):
    """The turn port: a model that answers committed turns (echo, cascade,
    the LLM responders). The session decides when a turn ends (server VAD or
    the client's commit); the model decides whether to answer it and streams
    the answer. The runtime puts it beside native duplex models through one
    adapter (``runtime/turn_feed.py``)."""

    def wants_to_speak(self, history: list[HistoryItem], config: SessionView) -> bool:
        """The model's turn decision after a commit: answer now, or keep listening."""
        ...

    def stream(self, request: ResponseRequest) -> AsyncIterator[ModelChunk]: ...

    def abort(self, response_id: str) -> None: ...


class ModelPort(Protocol):
    """A model as the session sees it: its facts, and exactly one of the two
    ways it takes input (``streaming`` unit by unit, or ``answering`` turn
    by turn)."""

    name: str
    capabilities: Capabilities
    turn_detection_types: tuple[str, ...]

    @property
    def streaming(self) -> Streaming | None:
        """The unit-by-unit port of a native duplex model, or None."""
        ...

    @property
    def answering(self) -> Answering | None:
        """The turn port of a turn-based model, or None."""
        ...

    @property
    def listening(self) -> Listening | None:
        """The model's ears (server VAD, transcripts), or None if it has none."""
        ...

    @property
    def loaded(self) -> bool:
        """Whether it can take a session now (its weights and workers are up);
        ``GET /ready`` answers 503 while it cannot, so load balancers drain it."""
        ...

    def accepts_voice(self, voice: str) -> bool:
        """Whether the model can speak in ``voice``; asked when a session or a
        response names one, so an unknown voice is refused then, not mid-answer."""
        ...

    def instructions_refusal(self, instructions: str) -> str | None:
        """Why the model cannot take ``instructions`` (None: it can); asked when
        a session names them (Moshi primes them as tokens, at most so many)."""
        ...


@runtime_checkable
class ProbedModel(Protocol):
    """A model that depends on something it must ask (a remote LLM, a
    remote recogniser or voice): every reason it cannot take a session now,
    for ``/ready`` (empty: it can)."""

    async def unready_reasons(self) -> list[str]: ...
