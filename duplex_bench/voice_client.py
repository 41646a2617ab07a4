"""The clients of ``bench voice``: people speaking recorded sentences into
a browser's microphone, and a bystander that only sends heartbeats.

A :class:`Speaker`'s microphone never stops, as a page's does not: every
``chunk_ms`` it appends that much audio, the recording while one is being
said and silence otherwise, on an absolute schedule at real-time pace. It
says one utterance a turn, waits for the answer and listens to it at real
time (its microphone sending silence meanwhile) before the next. A
:class:`HeartbeatProbe` is a fifth session that does nothing but send
``session.heartbeat`` and time the ``session.heartbeat_ack``: what a
session on the same server feels while the others speak.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
from dataclasses import dataclass, field

import websockets

from duplex_bench.recorded_speech import SAMPLE_RATE_HZ as SPEECH_RATE_HZ
from duplex_bench.recorded_speech import Utterance
from duplex_server.surface import resample_pcm16

RATE = 24_000  # pcm16, the server's default input format: what a page sends
LEAD_SILENCE_S = 0.6  # before each utterance, so the VAD hears its onset
# After the utterance is sent, for its answer to end: long, since a server
# that falls behind answers late, and a turn given up too soon would leave
# its answer to be taken for the next turn's.
ANSWER_TIMEOUT_S = 60.0
# The VAD may date a start a little before the speech (its window, its pad),
# and an end a little before the recording's last loud frame: a stop this
# close to the speech end ends the utterance; one earlier split it.
ONSET_SLACK_MS = 300.0
END_SLACK_MS = 1000.0
HEARTBEAT_PERIOD_S = 0.1
HEARTBEAT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Said:
    """An utterance queued on the microphone: its chunks, and futures for
    the instants its speech end and its last chunk were sent."""

    first_chunk: int
    chunks: int
    speech_end: asyncio.Future[float]
    sent: asyncio.Future[float]


@dataclass
class Turn:
    """One utterance said and what came back; times on the event loop's clock.

    The items the server's VAD opened for it are told apart from other
    turns' by where they start on the session's input timeline, which the
    client knows to the chunk: the VAD may lag behind the audio, so arrival
    order alone cannot say whose an event is."""

    utterance: str
    reference: str
    speech_end_at: float
    audio_from_ms: float  # on the server's input timeline (accepted chunks only)
    speech_end_ms: float
    audio_to_ms: float
    heard: list[str] = field(default_factory=list)  # every final transcript of the turn
    partials: int = 0  # transcription deltas while it was spoken
    vad_stops: int = 0  # more than one: the VAD split the utterance
    stopped_at: float | None = None  # the VAD's last speech_stopped before the answer
    first_audio_at: float | None = None
    answer_audio_s: float = 0.0
    stage_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def answered(self) -> bool:
        """Answered in a voice: a response to the whole utterance completed with audio."""
        return self.first_audio_at is not None

    @property
    def latency_s(self) -> float | None:
        """Speech end -> the answer's first audio."""
        return None if self.first_audio_at is None else self.first_audio_at - self.speech_end_at

    @property
    def end_to_stopped_s(self) -> float | None:
        """Speech end -> the VAD's speech_stopped: its silence hangover, and
        any wait behind other work (issue 18 saw 7-9 s behind recognition)."""
        return None if self.stopped_at is None else self.stopped_at - self.speech_end_at

    @property
    def stopped_to_audio_s(self) -> float | None:
        """The VAD's speech_stopped -> the answer's first audio."""
        if self.first_audio_at is None or self.stopped_at is None:
            return None
        return self.first_audio_at - self.stopped_at

    def report(self) -> dict:
        return {
            "utterance": self.utterance,
            "heard": " ".join(self.heard),
            "speech_end_to_first_audio_ms": _ms(self.first_audio_at, self.speech_end_at),
            "vad_stops": self.vad_stops,
            "partial_transcripts": self.partials,
            "stage_metrics": self.stage_metrics or None,
            "answered": self.answered,
        }


def _ms(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None:
        return None
    return round((later - earlier) * 1000, 1)


class Microphone:
    """``chunk_ms`` appends at real-time pace until stopped; what is queued
    is sent first, silence when nothing is."""

    def __init__(self, ws, chunk_ms: int) -> None:
        self._ws = ws
        self._step = RATE * chunk_ms // 1000 * 2
        self._period = chunk_ms / 1000
        self.chunk_ms = chunk_ms
        self._pending = bytearray()
        self._marks: list[tuple[int, asyncio.Future[float]]] = []  # (bytes left, when sent)
        self.appends = 0  # each carries event_id "mic<n>", n counting from 0
        self.refused: set[int] = set()  # the n of every append the server refused
        self.late_s = 0.0  # the most a chunk went out behind its schedule

    def say(self, pcm16: bytes, speech_end_s: float) -> Said:
        """Queue ``pcm16`` (24 kHz) after what is queued already."""
        loop = asyncio.get_running_loop()
        first_chunk = self.appends + -(-len(self._pending) // self._step)
        futures = []
        for offset in (min(len(pcm16), int(speech_end_s * RATE) * 2), len(pcm16)):
            future: asyncio.Future[float] = loop.create_future()
            self._marks.append((len(self._pending) + offset, future))
            futures.append(future)
        self._pending += pcm16
        return Said(first_chunk, -(-len(pcm16) // self._step), *futures)

    def server_ms(self, chunk: int) -> float:
        """Where chunk ``chunk`` starts on the server's input timeline: a
        refused append never reached it."""
        return (chunk - sum(1 for n in self.refused if n < chunk)) * self.chunk_ms

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        silence = b"\0" * self._step
        next_at = loop.time()
        while True:
            chunk = bytes(self._pending[: self._step]) or silence
            del self._pending[: self._step]
            audio = base64.b64encode(chunk.ljust(self._step, b"\0")).decode()
            append = {"type": "input_audio_buffer.append", "event_id": f"mic{self.appends}"}
            await self._ws.send(json.dumps({**append, "audio": audio}))
            sent = loop.time()
            self.appends += 1
            self.late_s = max(self.late_s, sent - next_at)
            self._resolve(len(chunk) if chunk is not silence else 0, sent)
            next_at += self._period
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def _resolve(self, sent_bytes: int, at: float) -> None:
        kept = []
        for position, future in self._marks:
            position -= sent_bytes
            if position <= 0:
                future.set_result(at)
            else:
                kept.append((position, future))
        self._marks = kept


@dataclass
class SessionOutcome:
    turns: list[Turn] = field(default_factory=list)
    appends: int = 0
    refused: int = 0  # rate_limited errors: audio the server would not take
    refusals: dict[str, int] = field(default_factory=dict)  # by the server's message
    other_errors: list[str] = field(default_factory=list)
    mic_late_ms: float = 0.0


class Speaker:
    """One session speaking its utterances, a turn each."""

    def __init__(self, url: str, chunk_ms: int, listen: bool = True) -> None:
        self.url = url
        self.chunk_ms = chunk_ms
        self.listen = listen  # to each answer, at real time, before the next turn
        self.outcome = SessionOutcome()
        self._events: asyncio.Queue[tuple[float, dict]] = asyncio.Queue()
        self._mic: Microphone | None = None

    async def run(self, utterances: list[Utterance]) -> SessionOutcome:
        async with websockets.connect(self.url, max_size=None, ping_interval=None) as ws:
            reader = asyncio.create_task(self._read(ws))
            await self._until("session.created")
            update = {
                "type": "session.update",
                "session": {"turn_detection": {"type": "server_vad"}},
            }
            await ws.send(json.dumps(update))
            await self._until("session.updated")
            mic = self._mic = Microphone(ws, self.chunk_ms)
            sending = asyncio.create_task(mic.run())
            try:
                for utterance in utterances:
                    await self._turn(mic, utterance)
            finally:
                sending.cancel()
                reader.cancel()
            self.outcome.appends = mic.appends
            self.outcome.mic_late_ms = round(mic.late_s * 1000, 1)
        return self.outcome

    async def _read(self, ws) -> None:
        loop = asyncio.get_running_loop()
        async for frame in ws:
            event = json.loads(frame)
            if event["type"] == "error":
                error = event.get("error") or {}
                if error.get("code") == "rate_limited":
                    self.outcome.refused += 1
                    message = str(error.get("message"))
                    self.outcome.refusals[message] = self.outcome.refusals.get(message, 0) + 1
                    event_id = str(error.get("event_id") or "")
                    if self._mic is not None and event_id.startswith("mic"):
                        self._mic.refused.add(int(event_id.removeprefix("mic")))
                else:
                    self.outcome.other_errors.append(f"{error.get('code')}: {error.get('message')}")
                continue
            await self._events.put((loop.time(), event))

    async def _until(self, kind: str) -> dict:
        while True:
            _, event = await asyncio.wait_for(self._events.get(), ANSWER_TIMEOUT_S)
            if event["type"] == kind:
                return event

    async def _turn(self, mic: Microphone, utterance: Utterance) -> None:
        loop = asyncio.get_running_loop()
        self._drain()  # what the last answer left behind (its closing events)
        await asyncio.sleep(LEAD_SILENCE_S)
        pcm = resample_pcm16(utterance.pcm16, SPEECH_RATE_HZ, RATE)
        said = mic.say(pcm, utterance.speech_end_s)
        speech_end_at = await said.speech_end
        await said.sent
        # the chunks' places on the server's timeline, once their refusals are in
        end_chunk = said.first_chunk + math.ceil(utterance.speech_end_s * 1000 / self.chunk_ms)
        turn = Turn(
            utterance.name,
            utterance.reference,
            speech_end_at,
            mic.server_ms(said.first_chunk),
            mic.server_ms(end_chunk),
            mic.server_ms(said.first_chunk + said.chunks),
        )
        self.outcome.turns.append(turn)
        try:
            await asyncio.wait_for(self._answer(turn), ANSWER_TIMEOUT_S)
        except TimeoutError:
            return  # unanswered; the turn says so
        if self.listen and turn.first_audio_at is not None:
            await asyncio.sleep(max(0.0, turn.first_audio_at + turn.answer_audio_s - loop.time()))

    def _drain(self) -> None:
        while not self._events.empty():
            self._events.get_nowait()

    def _mine(self, turn: Turn, start_ms: float) -> bool:
        """Whether speech the VAD dates at ``start_ms`` is this turn's utterance."""
        return turn.audio_from_ms - ONSET_SLACK_MS <= start_ms <= turn.audio_to_ms

    async def _answer(self, turn: Turn) -> None:
        """Events until the answer to the whole utterance is done: the first
        response that completes of those created after the turn's items
        stopped at its speech end (a response to part of the utterance,
        where the VAD split it, is not its answer)."""
        items: set[str] = set()
        stopped_at: float | None = None
        created: dict[str, float] = {}
        first_audio: dict[str, float] = {}
        audio_s: dict[str, float] = {}
        while True:
            at, event = await self._events.get()
            kind = event["type"]
            if kind == "input_audio_buffer.speech_started":
                if self._mine(turn, event.get("audio_start_ms", -1.0)):
                    items.add(event.get("item_id", ""))
                    stopped_at = None
                    created.clear()
            elif kind == "input_audio_buffer.speech_stopped":
                if event.get("item_id", "") in items:
                    turn.vad_stops += 1
                    if event.get("audio_end_ms", 0.0) >= turn.speech_end_ms - END_SLACK_MS:
                        stopped_at = at
            elif kind == "conversation.item.input_audio_transcription.delta":
                turn.partials += event.get("item_id", "") in items
            elif kind == "conversation.item.input_audio_transcription.completed":
                if event.get("item_id", "") in items:
                    turn.heard.append(event.get("transcript") or "")
            elif kind == "response.created":
                if stopped_at is not None:
                    created[event["response"]["id"]] = at
            elif kind == "response.output_audio.delta":
                rid = event["response_id"]
                first_audio.setdefault(rid, at)
                audio_s[rid] = audio_s.get(rid, 0.0) + len(base64.b64decode(event["delta"])) / (
                    2 * RATE
                )
            elif kind == "response.done":
                response = event["response"]
                rid = response["id"]
                if response["status"] == "completed" and rid in created:
                    turn.stopped_at = stopped_at
                    turn.first_audio_at = first_audio.get(rid)
                    turn.answer_audio_s = audio_s.get(rid, 0.0)
                    duplex = response.get("duplex") or {}
                    turn.stage_metrics = duplex.get("stage_metrics") or {}
                    return


class HeartbeatProbe:
    """A session that only sends heartbeats, one at a time, every
    ``HEARTBEAT_PERIOD_S``, and times each answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.rtt_s: list[float] = []
        self.lost = 0  # no ack within HEARTBEAT_TIMEOUT_S
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self, ready: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        async with websockets.connect(self.url, max_size=None, ping_interval=None) as ws:
            await ws.recv()  # session.created
            ready.set()
            while not self._stop.is_set():
                sent = loop.time()
                await ws.send('{"type":"session.heartbeat"}')
                try:
                    await asyncio.wait_for(self._ack(ws), HEARTBEAT_TIMEOUT_S)
                except TimeoutError:
                    self.lost += 1
                else:
                    self.rtt_s.append(loop.time() - sent)
                await asyncio.sleep(max(0.0, sent + HEARTBEAT_PERIOD_S - loop.time()))

    @staticmethod
    async def _ack(ws) -> None:
        while True:
            frame = await ws.recv()
            if '"session.heartbeat_ack"' in frame[:48]:
                return
