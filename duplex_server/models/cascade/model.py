"""The cascade model adapter: turns a committed user turn into spoken answer chunks.

The session core already ran VAD and ASR through :class:`CascadeStages`
(its ``listening``); a response takes the responder's text clause by clause
through the synthesiser, so the first audio leaves once the first clause is
synthesised, before the rest of the answer is.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

from duplex_server import progress
from duplex_server.audio import resample_pcm16
from duplex_server.engine import EngineCore, EngineRequest
from duplex_server.engine.audio.remote_speech import RemoteSpeechOptions
from duplex_server.engine.llm import (
    LLMOptions,
    RemoteOptions,
    build_llm_engine,
    build_remote_llm_engine,
)
from duplex_server.models.capabilities import built_in
from duplex_server.models.cascade.clause_buffer import ClauseBuffer, TextStream
from duplex_server.models.cascade.payload import SpeakPayload
from duplex_server.models.cascade.responder import Parrot, Reply, Responder, StageTimes
from duplex_server.models.cascade.stages import (
    CascadeStages,
    build_recogniser,
    build_synthesiser,
)
from duplex_server.models.engine_requests import for_response
from duplex_server.sessions.core.model_port import (
    FunctionCallPart,
    HistoryItem,
    ModelChunk,
    ResponseRequest,
    SessionView,
)
from protocol.capabilities import CLIENT_EVENT, SERVER_POLICY

OUTPUT_RATE_HZ = 24_000
CHUNK_PERIOD_MS = 100
DEFAULT_VOICE = "en-us+f3"
# Realtime API voice names, mapped onto eSpeak NG voice variants.
VOICES = {
    "default": DEFAULT_VOICE,
    "alloy": "en-us+f3",
    "ash": "en-us+m3",
    "ballad": "en+m1",
    "coral": "en-us+f2",
    "echo": "en-us+m1",
    "sage": "en+f3",
    "shimmer": "en-us+f4",
    "verse": "en-us+m2",
    "marin": "en-us+f5",
    "cedar": "en+m3",
}
# A clause ends at a sentence mark or a comma, semicolon or colon followed by
# a space (so "3,000" and "3.5" stay whole).
_CLAUSE_END = re.compile(r"(?<=[.!?,;:])\s+")
# Audio leaves at the pace it plays, this far ahead: the answer stays "being
# spoken" (so speech over it is an overlap) and a barge-in discards little.
LEAD_MS = 300.0


class Pacer:
    """Holds each chunk back until it is due: real time, ``LEAD_MS`` ahead."""

    def __init__(self) -> None:
        self._start: float | None = None
        self._released_ms = 0.0

    async def release(self, chunk_ms: float) -> None:
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        delay = self._start + (self._released_ms - LEAD_MS) / 1000 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        self._released_ms += chunk_ms


def clauses(text: str) -> list[str]:
    return [clause for clause in _CLAUSE_END.split(text.strip()) if clause]


def spread(text: str, pieces: int) -> list[str]:
    """``text`` in ``pieces`` consecutive slices (they join back to it), each
    about as long as its share of the audio and ending where a word ends: the
    words ride on the chunks that speak them, so an answer cut mid-clause
    keeps in history about the words that were played, not the whole clause."""
    slices, at = [], 0
    for index in range(1, pieces + 1):
        end = len(text) if index == pieces else max(at, round(len(text) * index / pieces))
        while 0 < end < len(text) and text[end - 1] != " " and text[end] != " ":
            end += 1  # to the end of the word
        slices.append(text[at:end])
        at = end
    return slices


class _Stages:
    """Stage times waiting for a chunk to ride on."""

    def __init__(self) -> None:
        self._held: dict[str, float] = {}

    def add(self, reply: StageTimes) -> None:
        self._held.update(reply.stage_ms)

    def take(self) -> dict[str, float] | None:
        held, self._held = self._held, {}
        return held or None


class _Voice:
    """One spoken answer's state across its clauses."""

    def __init__(self, name: str, speed: float) -> None:
        self.name, self.speed = name, speed
        self.started = time.perf_counter()
        self.spoken = False  # a clause was said (the next one starts with a space)
        self.pacer = Pacer()
        self.stages = _Stages()


class CascadeBackend:
    """Engine backend: responder text -> clauses -> synthesis -> 100 ms chunks,
    or, for a text-only response, the responder's text as it comes."""

    def __init__(self, stages: CascadeStages, responder: Responder) -> None:
        self.stages = stages
        self.responder = responder

    async def generate(self, request: EngineRequest[SpeakPayload]) -> AsyncIterator[ModelChunk]:
        """Text is spoken (or streamed), a tool call handed on. The
        responder's stage times ride on the next chunk, so they reach the
        log with the answer's output; those that come after the last one
        (an LLM's token figures) end the stream as a chunk of their own."""
        payload = request.payload
        replies = self.responder.respond(payload.history, request)
        stream = self._text(replies) if payload.text_only else self._speech(replies, payload)
        async for chunk in stream:
            yield chunk

    async def _text(self, replies: AsyncIterator[Reply]) -> AsyncIterator[ModelChunk]:
        """Each piece of text as soon as the responder has it (an LLM's
        token by token): no clause to wait for when nothing is spoken."""
        text, stages = TextStream(), _Stages()
        async for reply in replies:
            if isinstance(reply, StageTimes):
                stages.add(reply)
            elif isinstance(reply, FunctionCallPart):
                yield ModelChunk(function_call=reply, stage_ms=stages.take())
            elif piece := text.add(reply):
                yield ModelChunk(text=piece, stage_ms=stages.take())
        if figures := stages.take():
            yield ModelChunk(stage_ms=figures)

    async def _speech(
        self, replies: AsyncIterator[Reply], payload: SpeakPayload
    ) -> AsyncIterator[ModelChunk]:
        """Clause by clause into the synthesiser: the first audio leaves
        once the first clause is decoded and synthesised. What is held when
        the answer ends, calls a tool or breaks off is said then."""
        voice = _Voice(payload.voice, payload.speed)
        buffer = ClauseBuffer()
        try:
            async for reply in replies:
                if isinstance(reply, StageTimes):
                    voice.stages.add(reply)
                    continue
                if isinstance(reply, FunctionCallPart):
                    async for chunk in self._say(buffer.rest(), voice):
                        yield chunk
                    yield ModelChunk(function_call=reply, stage_ms=voice.stages.take())
                    continue
                async for chunk in self._say(buffer.add(reply), voice):
                    yield chunk
        except Exception:
            # The responder failed mid-answer (the engine died, a malformed
            # tool call): what it decoded before is still said, then the
            # failure ends the response.
            async for chunk in self._say(buffer.rest(), voice):
                yield chunk
            raise
        async for chunk in self._say(buffer.rest(), voice):
            yield chunk
        if figures := voice.stages.take():
            yield ModelChunk(stage_ms=figures)

    async def _say(self, text: str, voice: _Voice) -> AsyncIterator[ModelChunk]:
        for clause in clauses(text):
            spoken = (" " if voice.spoken else "") + clause
            first, voice.spoken = not voice.spoken, True
            if first:  # the answer's text was what its first audio waited for until now
                ready_ms = (time.perf_counter() - voice.started) * 1000
                voice.stages.add(StageTimes({"first_clause_ready_ms": ready_ms}))
            async for chunk in self._speak(spoken, voice.name, voice.speed, first):
                if figures := voice.stages.take():
                    chunk.stage_ms = {**figures, **(chunk.stage_ms or {})}
                await voice.pacer.release(len(chunk.audio) * 1000 / (2 * OUTPUT_RATE_HZ))
                yield chunk

    async def _speak(
        self, text: str, voice: str, speed: float, first: bool
    ) -> AsyncIterator[ModelChunk]:
        started = time.perf_counter()
        pcm, rate = await self.stages.synthesize(text.strip(), voice, speed)
        pcm = resample_pcm16(pcm, rate, OUTPUT_RATE_HZ)
        # The answer's first clause is the synthesis its first audio waited for.
        stages = {"tts_first_clause_ms": (time.perf_counter() - started) * 1000} if first else None
        step = OUTPUT_RATE_HZ * CHUNK_PERIOD_MS // 1000 * 2
        starts = range(0, max(len(pcm), 1), step)
        for index, (at, words) in enumerate(zip(starts, spread(text, len(starts)), strict=True)):
            yield ModelChunk(
                audio=pcm[at : at + step],
                sample_rate_hz=OUTPUT_RATE_HZ,
                text=words,
                stage_ms=stages if index == 0 else None,
            )


class CascadeModel:
    name = "cascade"
    turn_detection_types: tuple[str, ...] = ("server_vad",)
    # Its turns end by server VAD or the client's commit; the responder
    # answers what it heard in the audio, or a turn's text.
    capabilities = built_in(
        "cascade",
        CHUNK_PERIOD_MS,
        signal_sources=[CLIENT_EVENT, SERVER_POLICY],
        native_turn_policy=False,
        required_input_modalities=[],
        optional_input_modalities=["audio", "text"],
        text_only_turn=True,
    )
    streaming = None  # turn-based: it answers commits

    @property
    def loaded(self) -> bool:
        """Its stages load when it is built, before the server listens; an
        LLM responder's weights load in the background after that."""
        return self.responder.loaded

    @property
    def answering(self) -> CascadeModel:
        return self

    async def unready_reasons(self) -> list[str]:
        """``llm_unreachable`` while a remote LLM (``--llm-url``) does not
        answer, ``asr_unreachable`` / ``tts_unreachable`` while a remote
        recogniser (``--asr-url``) or voice (``--tts-url``) does not: each
        tier asked at once, every one that is down named."""
        llm, speech = await asyncio.gather(
            self.responder.unreachable(), self.listening.unready_reasons()
        )
        return (["llm_unreachable"] if llm is not None else []) + speech

    def __init__(
        self,
        stages: CascadeStages,
        engine: EngineCore[SpeakPayload, ModelChunk],
        responder: Responder,
    ) -> None:
        self.listening = stages
        self.engine = engine
        self.responder = responder
        from duplex_server.models.cascade.turn_ending import smart_turn_ending

        # semantic_vad's end-of-turn model; without it semantic_vad is refused.
        self.turn_ending = smart_turn_ending()
        if self.turn_ending is not None:
            self.turn_detection_types = ("server_vad", "semantic_vad")

    def wants_to_speak(self, history: list[HistoryItem], config: SessionView) -> bool:
        return any(item.role == "user" for item in history)

    def accepts_voice(self, voice: str) -> bool:
        """OpenAI's voice names and the synthesiser's own (eSpeak ``en-us+f3``)."""
        return self.listening.tts.knows_voice(VOICES.get(voice, voice))

    def instructions_refusal(self, instructions: str) -> str | None:
        return None  # read as text, any length the session takes

    def stream(self, request: ResponseRequest) -> AsyncIterator[ModelChunk]:
        config = request.config
        payload = SpeakPayload(
            history=request.history,
            voice=VOICES.get(config.voice, config.voice),
            speed=config.speed,
            text_only="audio" not in request.modalities,
            config=config,
        )
        return self.engine.submit(for_response(request, payload))

    def abort(self, response_id: str) -> None:
        self.engine.abort(response_id)

    def close(self) -> None:
        """At server shutdown (blocking): the responder's engine stops, and
        remote speech tiers' connections close."""
        self.responder.close()
        self.listening.close()


def build_cascade(
    phrases: list[str] | None = None,
    max_concurrency: int = 64,
    asr: str = "auto",
    tts: str = "espeak",
    llm: LLMOptions | RemoteOptions | None = None,
    asr_remote: RemoteSpeechOptions | None = None,
    tts_remote: RemoteSpeechOptions | None = None,
) -> CascadeModel:
    """``llm``: answer with that chat model (``--llm`` in process, or
    ``--llm-url`` on another server) instead of the parrot; ``asr_remote`` /
    ``tts_remote``: the recogniser / voice on another server (``--asr-url``,
    ``--tts-url``) instead of ``asr`` / ``tts``."""
    with progress.loads("loading the cascade", 3) as loading:
        recogniser = loading.load("recogniser", build_recogniser, asr, phrases, asr_remote)
        voice = loading.load("voice", build_synthesiser, tts, tts_remote, VOICES)
        stages = loading.load("voice activity", CascadeStages, recogniser, voice)
    responder: Responder = Parrot()
    if llm is not None:
        from duplex_server.models.cascade.llm_responder import LLMResponder

        if isinstance(llm, RemoteOptions):
            engine = build_remote_llm_engine(llm)
        else:
            engine = build_llm_engine(llm, max_concurrency)
            state = engine.state
            progress.watch(
                f"loading the LLM {llm.path}", lambda: state.loaded or state.load_error is not None
            )
        responder = LLMResponder(engine)
    backend = CascadeBackend(stages, responder)
    return CascadeModel(stages, EngineCore(backend, max_concurrency=max_concurrency), responder)
