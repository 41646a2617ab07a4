"""``duplex-server bench webrtc``: what a WebRTC call costs the server
against a WebSocket session of the same audio, in one run, and whether its
outbound audio keeps time.

Two paths, each on a fresh server process (``--model``, the default
cascade with ``--asr auto`` as ``bench telephony`` starts it) pinned to
``--server-cores`` (default 1: the target is calls per core), its CPU
(worker processes included) measured across the path's phase:

- WebRTC: ``--calls`` aiortc callers (``webrtc_peer.WebRtcPeer``, OpenAI's
  browser flow: ``POST /v1/realtime/calls``, the ``oai-events`` data
  channel, Opus both ways), input transcription on in the offer's session.
  Each says ``--turns`` recorded utterances (``recorded_speech``, 24 kHz
  into its microphone track, which never stops: silence between) and
  listens to each answer on its remote track until it has gone quiet;
- WebSocket: as many sessions on ``/v1/realtime?duplex=1`` saying the same
  utterances as ``bench telephony``'s do (``voice_client.Speaker``: 20 ms
  pcm16 appends at real-time pace, server VAD).

The clients of each path run in generator processes pinned to the cores
the server does not have (``load_processes``), started on one schedule
(``--ramp-s`` between the first call and the last; with ``--hold-s`` each
stays on the line after its turns until that long after the last started,
so that all are connected at once while their speech stays spread out).
Each process reports its CPU, and the run is invalid when one was busier
than ``bench sessions`` allows, a path's microphones fell behind real time,
or a client failed.

Per path: the word error rate of the final transcripts, voice-to-voice (the
instant the microphone frame holding the recording's last loud 20 ms was
handed to the sender -> the answer's first audible frame decoded from the
track, or the first ``response.output_audio.delta`` on the socket), the
server's CPU seconds per call-second, and the most calls connected at once.
For WebRTC, the outbound frames' lateness (each 20 ms frame handed to
aiortc's encoder after its due time, from the server's
``duplex_rtc_frame_lateness_seconds`` histogram across the phase:
quantiles interpolated within buckets) and underruns (frames more than
20 ms late, ``duplex_rtc_underruns_total``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
import psutil
from aiortc import MediaStreamTrack

from duplex_bench import recorded_speech
from duplex_bench.generator import BUSY_LIMIT_PERCENT, ProcessCpu, busy_reasons, verdict
from duplex_bench.load_processes import (
    READY,
    CorePlan,
    Cores,
    GeneratorPool,
    default_generators,
    pinned,
    usable_cores,
)
from duplex_bench.recorded_speech import SAMPLE_RATE_HZ as SPEECH_RATE_HZ
from duplex_bench.recorded_speech import Utterance
from duplex_bench.server_process import ServerProcess
from duplex_bench.telephony import (
    CHUNK_MS,
    Caller,
    Measured,
    PhoneTurn,
    call_plan,
    comparison_of,
    path_report,
)
from duplex_bench.voice import cpu_s
from duplex_bench.voice_client import (
    ANSWER_TIMEOUT_S,
    LEAD_SILENCE_S,
    Microphone,
    SessionOutcome,
    Speaker,
    Turn,
)
from duplex_bench.webrtc_peer import FRAME_BYTES, FRAME_SAMPLES, RATE_HZ, WebRtcPeer
from duplex_server.surface import histogram_quantile, parse_histogram, resample_pcm16, sample_value

FRAME_MS = 20
LATENESS = "duplex_rtc_frame_lateness_seconds"
UNDERRUNS = "duplex_rtc_underruns_total"
# The offer's session: OpenAI's WebRTC sessions transcribe only when asked.
SESSION = {
    "type": "realtime",
    "audio": {
        "input": {
            "transcription": {"model": "whisper-1"},
            "turn_detection": {"type": "server_vad"},
        }
    },
}
# A decoded frame this loud (rms, of 32768) is audio; Opus's silence decodes to 0.
AUDIBLE_RMS = 8.0
# After the answer's response.done, the track this long without an audible
# frame: the caller has heard it all (its output_audio_buffer.stopped may
# never come: see docs/benchmarks/webrtc.md).
QUIET_S = 0.5
HEARD_POLL_S = 0.02
# Limits on a broken call, not measurements: the offer's post and the data
# channel's opening, and the hangup's post.
CONNECT_LIMIT_S = 30 + ANSWER_TIMEOUT_S
HANG_UP_LIMIT_S = 10.0
TARGET_CALLS = 50
TARGET_P99_LATENESS_MS = 20.0
TARGET_CPU_RATIO = 2.0


class TimedMicrophone(MediaStreamTrack):
    """The peer's microphone as its RTP sender pulls it: which frame went
    out when, so an utterance's frames are placed on the call's input
    timeline (20 ms a frame since the first) and its speech end is timed.

    It stands in for the microphone on the sender (``replaceTrack``) and
    hands on the microphone's own frames, whose pts count from its first."""

    kind = "audio"

    def __init__(self, peer: WebRtcPeer) -> None:
        super().__init__()
        self._peer = peer
        self._marks: list[tuple[int, asyncio.Future[float]]] = []  # (frame index, when sent)
        self._last = -1  # the index of the last frame handed over
        self._first: tuple[int, float] | None = None  # (index, when) of the first seen
        self.pulled = asyncio.Event()
        self.late_s = 0.0  # the most a frame went out behind the first's schedule
        sender = next(t.sender for t in peer.pc.getTransceivers() if t.kind == "audio")
        sender.replaceTrack(self)

    def say(self, pcm16: bytes, speech_end_s: float) -> tuple[int, asyncio.Future[float]]:
        """Queue ``pcm16`` (24 kHz) on an idle microphone: the index of its
        first frame, and the instant the frame ending its speech is sent."""
        loop = asyncio.get_running_loop()
        first = self._last + 1  # the frame being made next takes the queue's head
        end = first + max(1, math.ceil(speech_end_s * 1000 / FRAME_MS)) - 1
        speech_end: asyncio.Future[float] = loop.create_future()
        self._marks.append((end, speech_end))
        self._peer.speak(pcm16)
        return first, speech_end

    async def recv(self):  # an av.AudioFrame
        frame = await self._peer.microphone.recv()
        now = asyncio.get_running_loop().time()
        index = int(frame.pts) // FRAME_SAMPLES
        if self._first is None:
            self._first = (index, now)
            self.pulled.set()
        due = self._first[1] + (index - self._first[0]) * FRAME_MS / 1000
        self.late_s = max(self.late_s, now - due)
        self._last = index
        kept = []
        for at, future in self._marks:
            if at <= index:
                future.set_result(now)
            else:
                kept.append((at, future))
        self._marks = kept
        return frame


Said = tuple[str, str, str, float | None]  # utterance, reference, heard, latency (s)


def said(turns: Sequence[PhoneTurn | Turn]) -> list[Said]:
    """Turns as ``bench telephony``'s reports take them."""
    return [(t.utterance, t.reference, " ".join(t.heard), t.latency_s) for t in turns]


@dataclass
class CallOutcome:
    """One client's turns, how far its microphone fell behind, when it was connected."""

    turns: list[Said] = field(default_factory=list)
    late_ms: float = 0.0
    span: tuple[float, float] | None = None  # (connected, hanging up), monotonic
    error: str | None = None


class RtcCaller(Caller):
    """One WebRTC call saying its utterances, a turn each, listening to each
    answer on its track. The answer to a turn is told as ``bench
    telephony``'s calls tell it (``Caller._answer``), from the data
    channel's events on the call's input timeline."""

    def __init__(self, base_url: str, index: int) -> None:
        super().__init__(base_url, index)
        self.call = CallOutcome()
        self._turns: list[PhoneTurn] = []

    async def run_call(self, utterances: list[Utterance], hold_until: float) -> CallOutcome:
        """Dial, say each utterance and hear its answer, stay on the line
        (the microphone sending silence) until ``hold_until``, hang up."""
        loop = asyncio.get_running_loop()
        peer = await WebRtcPeer.call(self.base, session=SESSION, timeout_s=ANSWER_TIMEOUT_S)
        peer.channel.on("message", lambda m: self._events.put_nowait((loop.time(), json.loads(m))))
        for event in peer.events:  # those before this listener: session.created
            self._events.put_nowait((loop.time(), event))
        microphone = TimedMicrophone(peer)
        connected = time.monotonic()
        try:
            await asyncio.wait_for(microphone.pulled.wait(), ANSWER_TIMEOUT_S)
            for utterance in utterances:
                await self._say(peer, microphone, utterance)
            await asyncio.sleep(max(0.0, hold_until - loop.time()))
        finally:
            self.call.span = (connected, time.monotonic())
            self.call.turns = said(self._turns)
            self.call.late_ms = round(microphone.late_s * 1000, 1)
            with contextlib.suppress(httpx.HTTPError):
                async with httpx.AsyncClient(timeout=HANG_UP_LIMIT_S) as http:
                    await http.post(f"{self.base}{peer.location}/hangup")
            await peer.hang_up()
        return self.call

    async def _say(self, peer: WebRtcPeer, microphone: TimedMicrophone, u: Utterance) -> None:
        await asyncio.sleep(LEAD_SILENCE_S)
        pcm = resample_pcm16(u.pcm16, SPEECH_RATE_HZ, RATE_HZ)
        first, speech_end = microphone.say(pcm, u.speech_end_s)
        end_frame = first + math.ceil(u.speech_end_s * 1000 / FRAME_MS)
        frames = -(-len(pcm) // FRAME_BYTES)
        turn = PhoneTurn(
            u.name,
            u.reference,
            await speech_end,
            first * FRAME_MS,
            end_frame * FRAME_MS,
            (first + frames) * FRAME_MS,
        )
        self._turns.append(turn)
        try:
            await asyncio.wait_for(self._answer(turn), ANSWER_TIMEOUT_S)
            await asyncio.wait_for(self._listen(peer, turn), ANSWER_TIMEOUT_S)
        except TimeoutError:
            return  # unanswered (or never heard); the turn says so

    async def _listen(self, peer: WebRtcPeer, turn: PhoneTurn) -> None:
        """The answer's first audible frame after the speech end, then until
        the track has been quiet for ``QUIET_S``."""
        loop = asyncio.get_running_loop()
        arrivals = peer.heard.arrivals
        start = next(
            (i for i, (at, _) in enumerate(arrivals) if at >= turn.speech_end_at), len(arrivals)
        )
        while True:
            audible = [at for at, rms in arrivals[start:] if rms >= AUDIBLE_RMS]
            if audible:
                if turn.first_audio_at is None:
                    turn.first_audio_at = audible[0]
                if loop.time() - audible[-1] >= QUIET_S:
                    return
            await asyncio.sleep(HEARD_POLL_S)


class HoldingSpeaker(Speaker):
    """``bench telephony``'s WebSocket speaker, staying on the line after its
    last turn (its microphone sending silence) until ``hold_until``."""

    def __init__(self, url: str, hold_until: float) -> None:
        super().__init__(url, CHUNK_MS)
        self._hold_until = hold_until
        self._left = 0

    async def run(self, utterances: list[Utterance]) -> SessionOutcome:
        self._left = len(utterances)
        return await super().run(utterances)

    async def _turn(self, mic: Microphone, utterance: Utterance) -> None:
        await super()._turn(mic, utterance)
        self._left -= 1
        if not self._left:
            await asyncio.sleep(max(0.0, self._hold_until - asyncio.get_running_loop().time()))


@dataclass(frozen=True)
class CallShare:
    """One generator process's clients: their path, the server, their
    index in the whole load (their place in the ramp) and their scripts."""

    path: str  # "webrtc" or "websocket"
    url: str
    indices: tuple[int, ...]
    calls: int
    scripts: tuple[tuple[Utterance, ...], ...]
    hold_s: float  # every client on the line until this long after the last one started
    cores: Cores | None


@dataclass
class ShareOutcome:
    turns: list[Said]
    late_ms: float
    spans: list[tuple[float, float]]
    errors: list[str]
    cpu: ProcessCpu


def _generator(conn, share: CallShare) -> None:
    """A generator process: pin, say ready, wait for the schedule, run the clients."""
    if share.cores is not None:
        os.sched_setaffinity(0, share.cores)
    conn.send(READY)
    schedule = conn.recv()
    conn.send(asyncio.run(_clients(share, schedule.start, schedule.ramp_s)))
    conn.close()


async def _clients(share: CallShare, start: float, ramp_s: float) -> ShareOutcome:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start - loop.time()))
    cpu_before, wall_before = time.process_time(), time.monotonic()
    hold_until = start + ramp_s + share.hold_s
    runs = [
        _client(share, script, start + ramp_s * index / share.calls, hold_until, index)
        for index, script in zip(share.indices, share.scripts, strict=True)
    ]
    outcomes = await asyncio.gather(*runs)
    cpu = ProcessCpu(
        os.getpid(),
        share.cores,
        len(share.indices),
        time.process_time() - cpu_before,
        time.monotonic() - wall_before,
    )
    return ShareOutcome(
        [turn for o in outcomes for turn in o.turns],
        max((o.late_ms for o in outcomes), default=0.0),
        [o.span for o in outcomes if o.span is not None],
        [o.error for o in outcomes if o.error is not None],
        cpu,
    )


async def _client(
    share: CallShare, script: tuple[Utterance, ...], at: float, hold_until: float, index: int
) -> CallOutcome:
    """One client, started at ``at`` (the loop's clock)."""
    await asyncio.sleep(max(0.0, at - asyncio.get_running_loop().time()))
    connected = time.monotonic()
    try:
        if share.path == "websocket":
            outcome = await HoldingSpeaker(share.url, hold_until).run(list(script))
            return CallOutcome(
                said(outcome.turns), outcome.mic_late_ms, (connected, time.monotonic())
            )
        return await RtcCaller(share.url, index).run_call(list(script), hold_until)
    except Exception as exc:  # a refused or failed client is reported, not fatal
        return CallOutcome(error=f"{share.path} {index}: {type(exc).__name__}: {exc}"[:300])


class CallerPool(GeneratorPool):
    """``load_processes``' generator processes, running callers: the pool
    starts, pins and reaps them as for ``bench sessions``; only the
    function each runs is this module's."""

    def __init__(self, shares: list[CallShare], limit_s: float) -> None:
        super().__init__(shares, target=_generator)  # type: ignore[arg-type]  # it reads .cores
        self._limit_s = limit_s

    def outcomes(self) -> list[ShareOutcome]:  # type: ignore[override]
        """Each process's outcome once its clients have hung up: a phase
        lasts as long as its turns take, so the limit (on a broken
        generator, not a measurement) is the phase's longest."""
        return [self._receive(index, self._limit_s) for index in range(len(self._running))]


def _scrape(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=30) as response:
        return response.read().decode()


def frame_figures(before: str, after: str) -> dict:
    """The outbound frames between two scrapes: how late each was handed
    over (ms quantiles, interpolated within buckets) and the underruns."""
    start = dict(parse_histogram(before, LATENESS))
    buckets = [(bound, n - start.get(bound, 0)) for bound, n in parse_histogram(after, LATENESS)]
    frames = buckets[-1][1] if buckets else 0
    hit = [bound for bound, n in buckets if n >= frames]
    top = hit[0] if frames and hit else None

    def ms(q: float) -> float | None:
        value = histogram_quantile(buckets, q)
        return None if value is None else round(value * 1000, 3)

    underruns = (sample_value(after, UNDERRUNS) or 0.0) - (sample_value(before, UNDERRUNS) or 0.0)
    return {
        "frames": frames,
        "lateness_ms_p50": ms(0.50),
        "lateness_ms_p99": ms(0.99),
        "lateness_ms_max_bucket": None if top is None or math.isinf(top) else round(top * 1000, 3),
        "underruns": int(underruns),
    }


def at_once(spans: list[tuple[float, float]]) -> int:
    """The most clients connected at one instant."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@dataclass(frozen=True)
class PathRun:
    measured: Measured
    spans: list[tuple[float, float]]
    errors: list[str]
    processes: list[ProcessCpu]
    frames: dict | None


def _measure(
    path: str, args: argparse.Namespace, scripts: list[list[Utterance]], cores: CorePlan
) -> PathRun:
    """A fresh server; the path's clients against it in generator processes;
    its CPU, its outbound frames' lateness and the generators' CPU."""
    server = ServerProcess(
        "memory",
        model=args.model,
        max_sessions=args.calls + 5,
        max_calls_in_setup=args.calls + 5,
    )
    try:
        with pinned(cores.server):
            server.start(timeout_s=120.0)
        proc = psutil.Process(server.pid)
        url = server.http_url if path == "webrtc" else server.ws_url
        generators = args.generators or default_generators(cores, usable_cores())
        shares = [
            CallShare(
                path,
                url,
                tuple(range(g, args.calls, generators)),
                args.calls,
                tuple(tuple(s) for s in scripts[g::generators]),
                args.hold_s,
                cores.generator_core(g),
            )
            for g in range(min(generators, args.calls))
        ]
        longest_s = max(u.seconds for script in scripts for u in script)
        limit_s = (
            args.ramp_s
            + CONNECT_LIMIT_S
            + args.turns * (2 * ANSWER_TIMEOUT_S + longest_s + 1)
            + args.hold_s
            + HANG_UP_LIMIT_S
            + 60
        )
        pool = CallerPool(shares, limit_s)
        with pool:
            before = _scrape(server)
            cpu_before, started = cpu_s(proc), time.monotonic()
            pool.start(args.ramp_s, 0.0)
            outcomes = pool.outcomes()
            cpu_after, seconds = cpu_s(proc), time.monotonic() - started
            after = _scrape(server)
    finally:
        server.stop()
    processes = [o.cpu for o in outcomes]
    reasons = busy_reasons(path, processes)
    generator = {
        "generator_cpu_percent": round(max(p.busy_percent for p in processes), 1),
        "generator_saturated": bool(reasons),
        "generator_processes": [p.report() for p in processes],
    }
    measured = Measured(
        [turn for o in outcomes for turn in o.turns],
        max(o.late_ms for o in outcomes),
        generator,
        cpu_after - cpu_before,
        seconds,
    )
    frames = frame_figures(before, after) if path == "webrtc" else None
    spans = [span for o in outcomes for span in o.spans]
    return PathRun(measured, spans, [e for o in outcomes for e in o.errors], processes, frames)


def _report(path: str, run: PathRun, calls: int) -> tuple[dict, list[str]]:
    report, reasons = path_report(path, run.measured, calls)
    reasons = [r for r in reasons if "event loop" not in r]  # busy_reasons says it better
    reasons = busy_reasons(path, run.processes) + reasons
    if run.errors:
        reasons.append(f"{path}: {len(run.errors)} of {calls} clients failed ({run.errors[0]})")
    report = {
        "calls_connected": len(run.spans),
        "calls_at_once_max": at_once(run.spans),
        "call_errors": run.errors[:10],
        **({"outbound_frames": run.frames} if run.frames is not None else {}),
        **report,
    }
    return report, reasons


def _targets(rtc: dict, comparison: dict) -> dict:
    frames = rtc["outbound_frames"]
    p99, ratio = frames["lateness_ms_p99"], comparison["cpu_per_call_ratio"]
    return {
        f"at_least_{TARGET_CALLS}_calls_at_once": rtc["calls_at_once_max"] >= TARGET_CALLS,
        "outbound_lateness_p99_under_20ms": p99 is not None and p99 < TARGET_P99_LATENESS_MS,
        "no_underruns": frames["frames"] > 0 and frames["underruns"] == 0,
        "cpu_per_call_at_most_2x_websocket": ratio is not None and ratio <= TARGET_CPU_RATIO,
    }


def run(args: argparse.Namespace) -> None:
    cores, utterances, scripts = call_plan("webrtc", args)
    load_start = os.getloadavg()
    measure: Callable[[str], PathRun] = lambda path: _measure(path, args, scripts, cores)  # noqa: E731
    rtc, rtc_reasons = _report("webrtc", measure("webrtc"), args.calls)
    socket, socket_reasons = _report("websocket", measure("websocket"), args.calls)
    comparison, _ = comparison_of(rtc, socket)  # telephony's ratios; this bench's targets
    print(
        json.dumps(
            {
                "bench": "webrtc",
                "calls": args.calls,
                "turns_per_call": args.turns,
                "model": args.model,
                "ramp_s": args.ramp_s,
                "hold_s": args.hold_s,
                "cpu_count": os.cpu_count(),
                "load_average": {"start": load_start, "end": os.getloadavg()},
                "pinning": cores.report(),
                "generator_busy_limit_percent": BUSY_LIMIT_PERCENT,
                "server": f"a fresh `serve --model {args.model}` per path; its CPU, worker "
                "processes included, across that path's phase",
                "speech": {
                    **recorded_speech.source(),
                    "utterances": len(utterances),
                    "webrtc": "24 kHz pcm16 into the microphone track (Opus, 20 ms frames)",
                    "websocket": "24 kHz pcm16, 20 ms appends",
                },
                **verdict(rtc_reasons + socket_reasons),
                "webrtc": rtc,
                "websocket": socket,
                "webrtc_vs_websocket": comparison,
                "targets": _targets(rtc, comparison),
            }
        )
    )
