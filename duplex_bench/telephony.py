"""``duplex-server bench telephony``: does a phone call get what a WebSocket
session gets, on the same recorded speech, in one run?

Two paths, each on a fresh server process (the default cascade, ``--asr
auto``, as ``bench voice`` starts it, with a Twilio auth token so the
carrier's routes are there), the server's CPU measured across each path's
phase:

- phone: ``--calls`` simulated Twilio calls at once (``twilio_peer``), each
  saying ``--turns`` recorded utterances in 8 kHz mu-law. The carrier's line
  never stops, as Twilio's does not: a 20 ms ``media`` frame every 20 ms,
  the recording while one is said and mu-law silence otherwise. Each call
  listens to its answer at real time (until the answer's last mark is
  echoed) before the next turn. A sideband socket per call
  (``/v1/realtime?call_id=CallSid``) gives the transcripts and which
  response answered the turn;
- WebSocket: as many sessions on ``/v1/realtime?duplex=1``, the same
  utterances as 24 kHz pcm16 in 20 ms appends at real-time pace, server
  VAD (``voice_client.Speaker``, as ``bench voice`` sends them).

Per path: the word error rate of the final transcripts (``wer``),
voice-to-voice (the last loud 20 ms of the utterance sent -> the answer's
first audio frame received: a ``media`` frame on the phone,
``response.output_audio.delta`` on the socket), the server's CPU seconds
per call-second (its worker processes included), and the bench's own CPU:
the run is invalid when the bench's event loop saturated its core or its
audio fell behind real time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import psutil
import websockets

from duplex_bench import recorded_speech, wer
from duplex_bench.generator import GeneratorCpu, verdict
from duplex_bench.load_processes import CorePlan, pinned, plan_cores, usable_cores
from duplex_bench.recorded_speech import SAMPLE_RATE_HZ as SPEECH_RATE_HZ
from duplex_bench.recorded_speech import Utterance
from duplex_bench.server_process import ServerProcess
from duplex_bench.twilio_peer import (
    FRAME_BYTES,
    FRAME_MS,
    TwilioPeer,
    to_mulaw,
)
from duplex_bench.voice import assign, cpu_s, quantiles_ms
from duplex_bench.voice_client import (
    ANSWER_TIMEOUT_S,
    END_SLACK_MS,
    LEAD_SILENCE_S,
    ONSET_SLACK_MS,
    Speaker,
)

TOKEN = "0123456789abcdef0123456789abcdef"  # the bench's own carrier and server share it
SILENCE = b"\xff"  # mu-law's zero
CHUNK_MS = 20  # the WebSocket path's appends, as a page sends them
# An audio frame later than this behind its schedule: the bench, not the
# server, set the pace of the audio (as in bench voice).
AUDIO_LATE_LIMIT_MS = 1000.0
SIDEBAND_TRIES = 200  # 50 ms apart: the call's session is made after `start` arrives
PLAYED_POLL_S = 0.02
TARGET_WER_DIFFERENCE = 0.1
TARGET_CPU_RATIO = 1.2
TARGET_V2V_DIFFERENCE_MS = 50.0

TRANSCRIPT = "conversation.item.input_audio_transcription.completed"


async def sideband(base: str, call_sid: str) -> websockets.ClientConnection:
    """The call's sideband, once its session exists (``call_not_found`` until then)."""
    for _ in range(SIDEBAND_TRIES):
        socket = await websockets.connect(
            f"ws://{base}/v1/realtime?call_id={call_sid}", max_size=None, ping_interval=None
        )
        await socket.send(json.dumps({"type": "session.update", "session": {}}))
        answer = json.loads(await asyncio.wait_for(socket.recv(), ANSWER_TIMEOUT_S))
        if answer["type"] == "session.updated":
            return socket
        await socket.close()
        if (answer.get("error") or {}).get("code") != "call_not_found":
            raise RuntimeError(f"sideband for {call_sid}: {answer}")
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the call {call_sid} never came up")


class PhoneLine:
    """The carrier's inbound audio: a 20 ms frame every 20 ms on an absolute
    schedule, what is queued first, mu-law silence when nothing is."""

    def __init__(self, peer: TwilioPeer) -> None:
        self._peer = peer
        self._pending = bytearray()
        self._marks: list[tuple[int, asyncio.Future[float]]] = []  # (bytes left, when sent)
        self.frames = 0
        self.late_s = 0.0

    def say(self, mulaw: bytes, speech_end_s: float) -> asyncio.Future[float]:
        """Queue ``mulaw``; the future is the instant its last loud frame is sent."""
        end = min(len(mulaw), max(1, int(speech_end_s * 8000)))
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._marks.append((len(self._pending) + end, future))
        self._pending += mulaw
        return future

    def next_frame(self) -> int:
        """The index of the frame the next queued byte goes out in."""
        return self.frames + -(-len(self._pending) // FRAME_BYTES)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            frame = bytes(self._pending[:FRAME_BYTES])
            del self._pending[:FRAME_BYTES]
            await self._peer.send(self._peer.media_frame(frame.ljust(FRAME_BYTES, SILENCE)))
            sent = loop.time()
            self.frames += 1
            self.late_s = max(self.late_s, sent - next_at)
            kept = []
            for left, future in self._marks:
                left -= len(frame)
                if left <= 0:
                    future.set_result(sent)
                else:
                    kept.append((left, future))
            self._marks = kept
            next_at += FRAME_MS / 1000
            await asyncio.sleep(max(0.0, next_at - loop.time()))


@dataclass
class PhoneTurn:
    utterance: str
    reference: str
    speech_end_at: float
    audio_from_ms: float  # the call's input timeline: 20 ms a frame since the first
    speech_end_ms: float
    audio_to_ms: float
    heard: list[str] = field(default_factory=list)
    first_audio_at: float | None = None

    @property
    def latency_s(self) -> float | None:
        return None if self.first_audio_at is None else self.first_audio_at - self.speech_end_at


@dataclass
class CallOutcome:
    turns: list[PhoneTurn] = field(default_factory=list)
    frames: int = 0
    late_ms: float = 0.0


class Caller:
    """One call saying its utterances, a turn each, listening to each answer."""

    def __init__(self, base: str, index: int) -> None:
        self.base = base
        self.index = index
        self.outcome = CallOutcome()
        self._events: asyncio.Queue[tuple[float, dict]] = asyncio.Queue()

    async def run(self, utterances: list[Utterance]) -> CallOutcome:
        peer = await TwilioPeer.dial(
            self.base,
            TOKEN,
            number=self.index + 1,
            to="+15550000001",
            **{"from": f"+1555100{self.index:04d}"},
        )
        app = await sideband(self.base, peer.call_sid)
        reader = asyncio.create_task(self._read(app))
        line = PhoneLine(peer)
        sending = asyncio.create_task(line.run())
        try:
            for utterance in utterances:
                await self._turn(line, peer, utterance)
        finally:
            sending.cancel()
            reader.cancel()
            await peer.stop()
            await peer.hang_up()
            await app.close()
        self.outcome.frames = line.frames
        self.outcome.late_ms = round(line.late_s * 1000, 1)
        return self.outcome

    async def _read(self, app: websockets.ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        async for frame in app:
            await self._events.put((loop.time(), json.loads(frame)))

    async def _turn(self, line: PhoneLine, peer: TwilioPeer, utterance: Utterance) -> None:
        await asyncio.sleep(LEAD_SILENCE_S)
        mulaw = to_mulaw(utterance.pcm16, SPEECH_RATE_HZ)
        first = line.next_frame()
        speech_end = line.say(mulaw, utterance.speech_end_s)
        end_frame = first + math.ceil(utterance.speech_end_s * 1000 / FRAME_MS)
        turn = PhoneTurn(
            utterance.name,
            utterance.reference,
            await speech_end,
            first * FRAME_MS,
            end_frame * FRAME_MS,
            (first + -(-len(mulaw) // FRAME_BYTES)) * FRAME_MS,
        )
        self.outcome.turns.append(turn)
        try:
            answer = await asyncio.wait_for(self._answer(turn), ANSWER_TIMEOUT_S)
            await asyncio.wait_for(self._heard(turn, answer, peer), ANSWER_TIMEOUT_S)
        except TimeoutError:
            return  # unanswered; the turn says so

    async def _answer(self, turn: PhoneTurn) -> str:
        """The id of the response to the whole utterance, as ``Speaker``
        tells it: the first to complete of those created after the VAD
        stopped the turn's speech at its end."""
        items: set[str] = set()
        stopped = False
        created: set[str] = set()
        while True:
            _, event = await self._events.get()
            kind = event["type"]
            if kind == "input_audio_buffer.speech_started":
                start_ms = event.get("audio_start_ms", -1.0)
                if turn.audio_from_ms - ONSET_SLACK_MS <= start_ms <= turn.audio_to_ms:
                    items.add(event.get("item_id", ""))
                    stopped = False
                    created.clear()
            elif kind == "input_audio_buffer.speech_stopped":
                if event.get("item_id", "") in items:
                    stopped = event.get("audio_end_ms", 0.0) >= turn.speech_end_ms - END_SLACK_MS
            elif kind == TRANSCRIPT:
                if event.get("item_id", "") in items:
                    turn.heard.append(event.get("transcript") or "")
            elif kind == "response.created" and stopped:
                created.add(event["response"]["id"])
            elif kind == "response.done":
                response = event["response"]
                if response["status"] == "completed" and response["id"] in created:
                    return response["id"]

    async def _heard(self, turn: PhoneTurn, answer: str, peer: TwilioPeer) -> None:
        """The answer's first ``media`` frame's arrival (each is followed by
        a mark named after its response), then until its last mark is
        echoed: the caller has heard it all."""
        prefix = f"{answer}@"
        while True:
            seen = len(peer.played.frames)
            frames = peer.played.frames[:seen]
            marks = [
                (i, f["mark"]["name"])
                for i, f in enumerate(frames)
                if f["event"] == "mark" and f["mark"]["name"].startswith(prefix)
            ]
            if marks:
                first_mark = marks[0][0]
                media = [i for i in range(first_mark) if frames[i]["event"] == "media"]
                if media:
                    turn.first_audio_at = peer.played.arrivals[media[-1]]
                last = marks[-1][1]
                done = peer.played.marks_echoed + peer.played.marks_dropped
                if last in done:
                    await asyncio.sleep(PLAYED_POLL_S * 5)  # any audio still on its way
                    if len(peer.played.frames) == seen:
                        return
            await asyncio.sleep(PLAYED_POLL_S)


@dataclass(frozen=True)
class Measured:
    """What one path's clients brought back, as (utterance, reference,
    heard, latency) per turn, with the most its audio fell behind."""

    turns: list[tuple[str, str, str, float | None]]
    late_ms: float
    generator: dict
    server_cpu_s: float
    seconds: float


async def _phone(base: str, scripts: list[list[Utterance]]) -> tuple[list[tuple], float]:
    outcomes = await asyncio.gather(*(Caller(base, i).run(s) for i, s in enumerate(scripts)))
    turns = [
        (t.utterance, t.reference, " ".join(t.heard), t.latency_s)
        for o in outcomes
        for t in o.turns
    ]
    return turns, max(o.late_ms for o in outcomes)


async def _websocket(url: str, scripts: list[list[Utterance]]) -> tuple[list[tuple], float]:
    outcomes = await asyncio.gather(*(Speaker(url, CHUNK_MS).run(s) for s in scripts))
    turns = [
        (t.utterance, t.reference, " ".join(t.heard), t.latency_s)
        for o in outcomes
        for t in o.turns
    ]
    return turns, max(o.mic_late_ms for o in outcomes)


Clients = Callable[[ServerProcess], Awaitable[tuple[list[tuple], float]]]


def _measure(clients: Clients, calls: int, cores: CorePlan) -> Measured:
    """A fresh cascade server; the clients against it, its CPU and ours across them."""
    server = ServerProcess(
        "memory", model="cascade", twilio_auth_token=TOKEN, max_sessions=calls + 5
    )
    try:
        with pinned(cores.server):
            server.start(timeout_s=120.0)
        proc = psutil.Process(server.pid)
        with pinned(cores.generators):
            generator = GeneratorCpu()

            async def phase() -> tuple[list[tuple], float]:
                generator.start()
                return await clients(server)

            cpu_before, started = cpu_s(proc), time.monotonic()
            turns, late_ms = asyncio.run(phase())
            cpu = generator.report()
            cpu_after, seconds = cpu_s(proc), time.monotonic() - started
    finally:
        server.stop()
    return Measured(turns, late_ms, cpu, cpu_after - cpu_before, seconds)


def path_report(name: str, measured: Measured, calls: int) -> tuple[dict, list[str]]:
    scores = [wer.score(reference, heard) for _, reference, heard, _ in measured.turns]
    pooled = wer.total(scores)
    latencies = [latency for *_, latency in measured.turns if latency is not None]
    call_seconds = calls * measured.seconds
    report = {
        "turns": len(measured.turns),
        "turns_answered": len(latencies),
        "word_error_rate": None if pooled.rate is None else round(pooled.rate, 4),
        "word_errors": pooled.errors,
        "reference_words": pooled.reference_words,
        "voice_to_voice_ms": quantiles_ms(latencies),
        "server_cpu_s": round(measured.server_cpu_s, 2),
        "call_seconds": round(call_seconds, 1),
        "server_cpu_s_per_call_second": round(measured.server_cpu_s / call_seconds, 4),
        "seconds": round(measured.seconds, 1),
        **measured.generator,
        "audio_late_ms_max": measured.late_ms,
        "transcripts": [
            {
                "utterance": utterance,
                "reference": reference,
                "heard": heard,
                "word_errors": score.errors,
                "voice_to_voice_ms": None if latency is None else round(latency * 1000, 1),
            }
            for (utterance, reference, heard, latency), score in zip(
                measured.turns, scores, strict=True
            )
        ],
    }
    reasons = []
    if measured.generator["generator_saturated"]:
        reasons.append(
            f"{name}: the bench's event loop was "
            f"{measured.generator['generator_cpu_percent']} % busy"
        )
    if measured.late_ms > AUDIO_LATE_LIMIT_MS:
        reasons.append(f"{name}: the audio fell {measured.late_ms} ms behind real time")
    return report, reasons


def _difference(a: float | None, b: float | None, digits: int) -> float | None:
    return None if a is None or b is None else round(a - b, digits)


def comparison_of(phone: dict, socket: dict) -> tuple[dict, dict]:
    cpu_phone = phone["server_cpu_s_per_call_second"]
    cpu_socket = socket["server_cpu_s_per_call_second"]
    ratio = round(cpu_phone / cpu_socket, 3) if cpu_socket else None
    wer_diff = _difference(phone["word_error_rate"], socket["word_error_rate"], 4)
    v2v_diff = _difference(phone["voice_to_voice_ms"]["p50"], socket["voice_to_voice_ms"]["p50"], 1)
    comparison = {
        "cpu_per_call_ratio": ratio,
        "word_error_rate_difference": wer_diff,
        "voice_to_voice_p50_difference_ms": v2v_diff,
    }
    targets = {
        "word_error_rate_within_0.1_of_websocket": wer_diff is not None
        and abs(wer_diff) <= TARGET_WER_DIFFERENCE,
        "cpu_per_call_at_most_1.2x_websocket": ratio is not None and ratio <= TARGET_CPU_RATIO,
        "voice_to_voice_p50_within_50ms_of_websocket": v2v_diff is not None
        and abs(v2v_diff) <= TARGET_V2V_DIFFERENCE_MS,
    }
    return comparison, targets


def call_plan(
    bench: str, args: argparse.Namespace
) -> tuple[CorePlan, list[Utterance], list[list[Utterance]]]:
    """What a bench of calls checks before it starts (``--calls``, ``--turns``,
    ``--server-cores``), and what it then runs: the cores, the recordings,
    each call's utterances. A bad argument exits, naming the bench."""
    if args.calls < 1 or args.turns < 1:
        raise SystemExit(f"bench {bench}: --calls and --turns must be at least 1")
    try:
        cores = plan_cores(args.server_cores, usable_cores())
    except ValueError as exc:
        raise SystemExit(f"bench {bench}: {exc}") from None
    utterances = recorded_speech.load_for(bench, args.speech_dir)
    return cores, utterances, assign(utterances, args.calls, args.turns)


def run(args: argparse.Namespace) -> None:
    cores, utterances, scripts = call_plan("telephony", args)
    phone, phone_reasons = path_report(
        "phone", _measure(lambda s: _phone(s.base, scripts), args.calls, cores), args.calls
    )
    socket, socket_reasons = path_report(
        "websocket",
        _measure(lambda s: _websocket(s.ws_url, scripts), args.calls, cores),
        args.calls,
    )
    comparison, targets = comparison_of(phone, socket)
    print(
        json.dumps(
            {
                "bench": "telephony",
                "calls": args.calls,
                "turns_per_call": args.turns,
                "cpu_count": os.cpu_count(),
                "pinning": cores.report(),
                "server": "a fresh `serve --model cascade` (asr auto) per path; its CPU, "
                "worker processes included, across that path's phase",
                "speech": {
                    **recorded_speech.source(),
                    "utterances": len(utterances),
                    "phone": "resampled to 8 kHz mu-law, 20 ms media frames",
                    "websocket": "resampled to 24 kHz pcm16, 20 ms appends",
                },
                **verdict(phone_reasons + socket_reasons),
                "phone": phone,
                "websocket": socket,
                "phone_vs_websocket": comparison,
                "targets": targets,
            }
        )
    )
