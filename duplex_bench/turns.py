"""``duplex-server bench turns``: where the server ends a person's turn, on
recorded speech whose pauses and ends are known (``turn_clips``).

One server process (the cascade, a memory store). For ``server_vad`` at
500 ms and ``semantic_vad`` at each ``--eagerness``, one after the other,
``--speakers`` sessions at once (default 4) stream ``--turns`` labelled
turns between them at real time in 20 ms appends, a fresh session per turn
(``create_response`` off: only the turn detection acts). Every
``input_audio_buffer.speech_stopped`` is placed on the session's audio
timeline, which the client knows to the chunk:

- premature: a stop whose ``audio_end_ms`` lies before the turn's true end
  of speech (less ``END_SLACK_MS``), at an inserted pause or at a natural gap;
- missed: no stop at the end decided within ``--missed-after-s`` of it;
- the delay from the true end of speech to the decision, in audio time: the
  audio the microphone had sent when the stop arrived, less the true end
  (hangover, judgement and any lag behind the audio all count).

The end-of-turn model's decision time comes from the server's ``/metrics``
(``duplex_stage_seconds{stage="turn"}``: features, queueing and the ONNX run).
The backchannel phase asks a question, and once its answer is playing plays
over it either a short acknowledgement or a real interruption; the answer
is cut when its ``response.done`` is not ``completed`` or the server
truncates its item.

Ratios compare each ``semantic_vad`` eagerness with ``server_vad`` in the
same run; ``targets`` are issue 37's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import websockets

from duplex_bench import recorded_speech, turn_clips
from duplex_bench.generator import GeneratorCpu, verdict
from duplex_bench.load_processes import pinned, plan_cores, usable_cores
from duplex_bench.recorded_speech import SAMPLE_RATE_HZ as SPEECH_RATE_HZ
from duplex_bench.recorded_speech import Utterance
from duplex_bench.server_process import ServerProcess
from duplex_bench.turn_clips import LabelledTurn
from duplex_bench.voice import quantiles_ms
from duplex_bench.voice_client import RATE, Microphone, Said
from duplex_server.surface import histogram_quantile, parse_histogram, resample_pcm16

BASELINE = "server_vad_500ms"
LEAD_MS = 600  # silence before each turn's speech
# The VAD may call the speech over a little before the recording's last
# loud frame (it dated "go forward ten meters" 408 ms early: the trailing
# "s"): a stop this close to the true end ends the turn, one earlier cut it
# (the cuts keep turn_clips.CUT_MARGIN_MS from the end, more than this).
END_SLACK_MS = 500.0
# A stop this close to an inserted pause's start is at that pause.
AT_PAUSE_MS = 300.0
GRACE_MS = 500.0  # streamed after the missed window, for a late event to arrive
OVERLAP_AFTER_S = 0.2  # into the answer's audio before it is talked over
ANSWER_TIMEOUT_S = 30.0
MIC_LATE_LIMIT_MS = 1000.0  # see bench voice: the bench, not the server, set the pace
TARGET_DECISION_P99_MS = 20.0
TARGET_EARLY_FRACTION = 1 / 3
# "At the same median delay": an eagerness whose median delay is at most
# this much of server_vad's.
SAME_DELAY = 1.1


def detections(eagerness: list[str]) -> dict[str, dict]:
    """The turn detections under test, by name, the baseline first."""
    named = {BASELINE: {"type": "server_vad", "silence_duration_ms": 500}}
    for level in eagerness:
        named[f"semantic_vad_{level}"] = {"type": "semantic_vad", "eagerness": level}
    return named


Script = Callable[["Session"], Awaitable[None]]


@dataclass
class Stop:
    audio_end_ms: float  # the server's word: where the speech ended
    decided_ms: float  # the audio sent when the stop arrived


@dataclass
class Session:
    """One WebSocket session with a microphone at real time; every event kept
    with the number of appends sent when it arrived."""

    url: str
    chunk_ms: int
    events: list[tuple[int, dict]] = field(default_factory=list)
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    mic_late_ms: float = 0.0
    appends: int = 0
    _mic: Microphone | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def mic(self) -> Microphone:
        assert self._mic is not None, "not connected"
        return self._mic

    async def run(self, detection: dict, script: Script) -> None:
        async with websockets.connect(self.url, max_size=None, ping_interval=None) as ws:
            reader = asyncio.create_task(self._read(ws))
            await self.until("session.created")
            update = {"type": "session.update", "session": {"turn_detection": detection}}
            await ws.send(json.dumps(update))
            await self.until("session.updated")
            self._mic = Microphone(ws, self.chunk_ms)
            sending = asyncio.create_task(self.mic.run())
            try:
                await script(self)
            finally:
                sending.cancel()
                reader.cancel()
            self.appends = self.mic.appends
            self.mic_late_ms = round(self.mic.late_s * 1000, 1)

    async def _read(self, ws) -> None:
        async for frame in ws:
            event = json.loads(frame)
            if event["type"] == "error":
                error = event.get("error") or {}
                if error.get("code") == "rate_limited":
                    self.refused += 1
                    event_id = str(error.get("event_id") or "")
                    if self._mic is not None and event_id.startswith("mic"):
                        self._mic.refused.add(int(event_id.removeprefix("mic")))
                else:
                    self.errors.append(f"{error.get('code')}: {error.get('message')}")
                continue
            if event["type"] != "response.output_audio.delta":
                event.pop("delta", None)
            sent = self._mic.appends if self._mic is not None else 0
            self.events.append((sent, event))
            self._arrived.set()

    async def until(self, kind: str, since: int = 0, timeout_s: float = ANSWER_TIMEOUT_S) -> dict:
        """The first event of ``kind`` from index ``since`` on."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        index = since
        while True:
            while index < len(self.events):
                if self.events[index][1]["type"] == kind:
                    return self.events[index][1]
                index += 1
            self._arrived.clear()
            left = deadline - asyncio.get_running_loop().time()
            await asyncio.wait_for(self._arrived.wait(), max(left, 0.0))

    def say(self, pcm16_16k: bytes, speech_end_s: float, lead_ms: int = 0) -> Said:
        pcm = bytes(RATE * lead_ms // 1000 * 2) + resample_pcm16(pcm16_16k, SPEECH_RATE_HZ, RATE)
        return self.mic.say(pcm, lead_ms / 1000 + speech_end_s)

    def at_ms(self, first_chunk: int, ms: float) -> float:
        """Where ``ms`` into audio queued from ``first_chunk`` lies on the server's timeline."""
        chunk = first_chunk + int(ms // self.chunk_ms)
        return self.mic.server_ms(chunk) + ms % self.chunk_ms

    async def stream_until(self, position_ms: float) -> None:
        """Until the microphone has sent ``position_ms`` of audio."""
        while self.mic.appends * self.chunk_ms < position_ms:
            await asyncio.sleep(0.05)


@dataclass
class TurnOutcome:
    turn: LabelledTurn
    stops: list[Stop]
    true_end_ms: float
    pauses_ms: list[tuple[float, float]]
    missed_after_ms: float

    @property
    def early(self) -> list[Stop]:
        return [s for s in self.stops if s.audio_end_ms < self.true_end_ms - END_SLACK_MS]

    @property
    def delay_ms(self) -> float | None:
        """True end of speech -> the stop that ended the turn, in audio ms."""
        final = [s for s in self.stops if s.audio_end_ms >= self.true_end_ms - END_SLACK_MS]
        return None if not final else final[0].decided_ms - self.true_end_ms

    @property
    def missed(self) -> bool:
        delay = self.delay_ms
        return delay is None or delay > self.missed_after_ms

    def at_pause(self, stop: Stop) -> bool:
        return any(abs(stop.audio_end_ms - start) <= AT_PAUSE_MS for start, _ in self.pauses_ms)

    def report(self) -> dict:
        delay = self.delay_ms
        return {
            **self.turn.report(),
            "stops_audio_end_ms": [round(s.audio_end_ms - self.true_end_ms) for s in self.stops],
            "early_stops": len(self.early),
            "early_at_inserted_pause": sum(self.at_pause(s) for s in self.early),
            "delay_ms": None if delay is None else round(delay),
            "missed": self.missed,
        }


async def _speakers(
    url: str, chunk_ms: int, speakers: int, jobs: list[tuple[dict, Script]]
) -> list[Session]:
    """Run ``(detection, script)`` jobs, ``speakers`` at a time, a session each."""
    queue = list(enumerate(jobs))
    sessions: list[Session | None] = [None] * len(jobs)

    async def speaker() -> None:
        while queue:
            index, (detection, script) = queue.pop(0)
            session = sessions[index] = Session(url, chunk_ms)
            try:
                await session.run(detection, script)
            except (TimeoutError, websockets.ConnectionClosed) as exc:
                # the outcome says what it lacks (no stop, no status); the run goes on
                session.errors.append(f"session gave up: {exc!r}")

    await asyncio.gather(*(speaker() for _ in range(speakers)))
    return [s for s in sessions if s is not None]


def _turn_script(turn: LabelledTurn, missed_after_ms: float, into: list[TurnOutcome]) -> Script:
    async def script(s: Session) -> None:
        await asyncio.sleep(0.1)
        said = s.say(turn.pcm16, turn.speech_end_ms / 1000, LEAD_MS)
        true_end = s.at_ms(said.first_chunk, LEAD_MS + turn.speech_end_ms)
        await s.stream_until(true_end + missed_after_ms + GRACE_MS)
        stops = [
            Stop(float(e["audio_end_ms"]), s.mic.server_ms(sent))
            for sent, e in s.events
            if e["type"] == "input_audio_buffer.speech_stopped"
        ]
        pauses = [
            (s.at_ms(said.first_chunk, LEAD_MS + a), s.at_ms(said.first_chunk, LEAD_MS + b))
            for a, b in turn.pauses
        ]
        into.append(TurnOutcome(turn, stops, true_end, pauses, missed_after_ms))

    return script


@dataclass
class OverlapOutcome:
    clip: str
    kind: str  # "acknowledgement" or "interruption"
    seconds: float
    status: str | None = None  # the talked-over answer's response.done status
    truncated: bool = False
    overlap_decisions: list[str] = field(default_factory=list)
    overlap_reasons: list[str] = field(default_factory=list)  # why each decision

    @property
    def cut(self) -> bool:
        return self.truncated or (self.status is not None and self.status != "completed")

    @property
    def judged(self) -> bool:
        """Whether the overlap was judged while the answer still played: one
        whose answer ended while its words were awaited (``answer_ended``)
        had nothing left to cut, whatever the policy."""
        return not (not self.cut and "answer_ended" in self.overlap_reasons)

    def report(self) -> dict:
        return {
            "clip": self.clip,
            "seconds": round(self.seconds, 2),
            "status": self.status,
            "truncated": self.truncated,
            "overlap_decisions": self.overlap_decisions,
            "overlap_reasons": self.overlap_reasons,
            "cut": self.cut,
            "judged": self.judged,
        }


def _overlap_script(question: Utterance, clip: Utterance, outcome: OverlapOutcome) -> Script:
    async def script(s: Session) -> None:
        await asyncio.sleep(0.1)
        s.say(question.pcm16, question.speech_end_s, LEAD_MS)
        created = await s.until("response.created")
        answer = created["response"]["id"]
        since = len(s.events)
        await s.until("response.output_audio.delta", since)
        await asyncio.sleep(OVERLAP_AFTER_S)
        s.say(clip.pcm16, clip.speech_end_s)
        while True:
            done = await s.until("response.done", since)
            since = next(i for i, (_, e) in enumerate(s.events) if e is done) + 1
            if done["response"]["id"] == answer:
                break
        outcome.status = done["response"]["status"]
        await asyncio.sleep(0.5)  # a truncation or decision told after the done
        for _, event in s.events:
            if event["type"] == "conversation.item.truncated":
                outcome.truncated = True
            if event["type"] == "overlap.decision":
                outcome.overlap_decisions.append(str(event.get("action")))
                outcome.overlap_reasons.append(str(event.get("reason")))

    return script


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def turn_buckets(text: str) -> list[tuple[float, int]]:
    """``duplex_stage_seconds{stage="turn"}``: ``[(upper_bound, cumulative_count)]``."""
    return parse_histogram(text, "duplex_stage_seconds", {"stage": "turn"})


def _between(before: list[tuple[float, int]], after: list[tuple[float, int]]) -> dict:
    """The turn decisions timed between two scrapes: count, p50, p99 (ms)."""
    earlier = dict(before)
    buckets = [(bound, count - earlier.get(bound, 0)) for bound, count in after]
    calls = buckets[-1][1] if buckets else 0

    def ms(q: float) -> float | None:
        value = histogram_quantile(buckets, q) if calls else None
        return None if value is None else round(value * 1000, 2)

    return {"judged": calls, "p50_ms": ms(0.5), "p99_ms": ms(0.99)}


@dataclass(frozen=True)
class Plan:
    url: str
    metrics_url: str
    chunk_ms: int
    speakers: int
    missed_after_ms: float


def _phase(plan: Plan, detection: dict, turns: list[LabelledTurn]) -> dict:
    before = turn_buckets(_scrape(plan.metrics_url))
    generator = GeneratorCpu()
    generator.start()
    outcomes: list[TurnOutcome] = []
    quiet = {**detection, "create_response": False}
    jobs = [(quiet, _turn_script(turn, plan.missed_after_ms, outcomes)) for turn in turns]
    started = time.monotonic()
    sessions = asyncio.run(_speakers(plan.url, plan.chunk_ms, plan.speakers, jobs))
    seconds = time.monotonic() - started
    cpu = generator.report()
    decision = _between(before, turn_buckets(_scrape(plan.metrics_url)))
    return _phase_report(outcomes, sessions, cpu, decision, seconds)


def _phase_report(
    outcomes: list[TurnOutcome], sessions: list[Session], cpu: dict, decision: dict, seconds: float
) -> dict:
    paused = [o for o in outcomes if o.turn.paused]
    early = [o for o in outcomes if o.early]
    delays = [o.delay_ms / 1000 for o in outcomes if o.delay_ms is not None and not o.missed]
    missed = [o for o in outcomes if o.missed]
    return {
        "turns": len(outcomes),
        "paused_turns": len(paused),
        "early_turns": len(early),
        "early_turns_paused": sum(bool(o.early) for o in paused),
        "early_turns_clean": sum(bool(o.early) for o in outcomes if not o.turn.paused),
        "early_rate": _rate(len(early), len(outcomes)),
        "early_stops": sum(len(o.early) for o in outcomes),
        "early_stops_at_inserted_pause": sum(o.at_pause(s) for o in outcomes for s in o.early),
        "missed_turns": len(missed),
        "missed_rate": _rate(len(missed), len(outcomes)),
        "end_of_turn_delay_ms": quantiles_ms(delays, (50, 90, 99)),
        "decision": decision,
        "appends_sent": sum(s.appends for s in sessions),
        "appends_refused": sum(s.refused for s in sessions),
        "other_errors": [e for s in sessions for e in s.errors][:10],
        "mic_late_ms_max": max((s.mic_late_ms for s in sessions), default=0.0),
        "seconds": round(seconds, 1),
        **cpu,
        "per_turn": [o.report() for o in outcomes],
    }


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _overlaps(
    plan: Plan, detection: dict, clips: list[tuple[str, Utterance]], question: Utterance
) -> dict:
    generator = GeneratorCpu()
    generator.start()
    outcomes = [OverlapOutcome(clip.name, kind, clip.seconds) for kind, clip in clips]
    jobs = [
        (detection, _overlap_script(question, clip, outcome))
        for (_, clip), outcome in zip(clips, outcomes, strict=True)
    ]
    sessions = asyncio.run(_speakers(plan.url, plan.chunk_ms, plan.speakers, jobs))
    acks = [o for o in outcomes if o.kind == "acknowledgement"]
    interruptions = [o for o in outcomes if o.kind == "interruption"]
    return {
        "acknowledgements": len(acks),
        "acknowledgements_that_cut": sum(o.cut for o in acks),
        "interruptions": len(interruptions),
        "interruptions_that_did_not_cut": sum(not o.cut and o.judged for o in interruptions),
        # the answer ended before their words were known: not a verdict on the policy
        "interruptions_unjudged": sum(not o.judged for o in interruptions),
        "unanswered": sum(o.status is None for o in outcomes),
        "appends_refused": sum(s.refused for s in sessions),
        "other_errors": [e for s in sessions for e in s.errors][:10],
        "mic_late_ms_max": max((s.mic_late_ms for s in sessions), default=0.0),
        **generator.report(),
        "trials": [{"kind": o.kind, **o.report()} for o in outcomes],
    }


def _ratio(ours: float | int | None, base: float | int | None) -> float | None:
    return None if ours is None or not base else round(ours / base, 3)


def _targets(phases: dict[str, dict], overlaps: dict[str, dict]) -> dict:
    base = phases[BASELINE]
    base_p50 = base["end_of_turn_delay_ms"]["p50"]
    semantic = {name: p for name, p in phases.items() if name != BASELINE}
    at_same_delay = [
        name
        for name, p in semantic.items()
        if base_p50 is not None
        and p["end_of_turn_delay_ms"]["p50"] is not None
        and p["end_of_turn_delay_ms"]["p50"] <= base_p50 * SAME_DELAY
    ]
    fewer_early = [
        name
        for name in at_same_delay
        if semantic[name]["early_turns"] <= base["early_turns"] * TARGET_EARLY_FRACTION
    ]
    p99s = [p["decision"]["p99_ms"] for p in semantic.values() if p["decision"]["judged"]]
    semantic_overlaps = overlaps.get("semantic_vad")
    return {
        "eagerness_at_same_median_delay": at_same_delay,
        "eagerness_meeting_a_third_as_many_early": fewer_early,
        "semantic_vad_a_third_as_many_early_at_same_median_delay": bool(fewer_early),
        "decision_p99_under_20ms": bool(p99s)
        and all(p is not None and p < TARGET_DECISION_P99_MS for p in p99s),
        "no_appends_refused": sum(p["appends_refused"] for p in phases.values())
        + sum(o["appends_refused"] for o in overlaps.values())
        == 0,
        "no_acknowledgement_cut_the_answer": semantic_overlaps is not None
        and semantic_overlaps["acknowledgements_that_cut"] == 0
        and semantic_overlaps["unanswered"] == 0,
        "every_interruption_cut_the_answer": semantic_overlaps is not None
        and semantic_overlaps["interruptions_that_did_not_cut"] == 0
        and semantic_overlaps["interruptions_unjudged"] == 0  # each one shown, none skipped
        and semantic_overlaps["unanswered"] == 0,
    }


def _reasons(name: str, phase: dict) -> list[str]:
    reasons = []
    if phase["generator_saturated"]:
        busy = phase["generator_cpu_percent"]
        reasons.append(f"{name}: the bench's event loop was {busy} % busy")
    if phase["mic_late_ms_max"] > MIC_LATE_LIMIT_MS:
        reasons.append(f"{name}: a microphone fell {phase['mic_late_ms_max']} ms behind real time")
    return reasons


def run(args: argparse.Namespace) -> None:
    eagerness = [e.strip() for e in args.eagerness.split(",") if e.strip()]
    try:
        cores = plan_cores(args.server_cores, usable_cores())
    except ValueError as exc:
        raise SystemExit(f"bench turns: {exc}") from None
    utterances = recorded_speech.load_for("turns", args.speech_dir)
    turns = turn_clips.build(utterances, args.turns, args.seed)
    acks = turn_clips.acknowledgements(utterances)[: args.overlaps]
    interruptions = turn_clips.interruptions(utterances)[: args.overlaps]
    clips = [("acknowledgement", a) for a in acks] + [("interruption", i) for i in interruptions]
    question = turn_clips.question(utterances)
    # a session a turn; closed ones may still count while they can be resumed
    sessions = args.turns * (1 + len(eagerness)) + 2 * len(clips) + args.speakers + 5
    server = ServerProcess("memory", model="cascade", max_sessions=sessions)
    phases: dict[str, dict] = {}
    overlaps: dict[str, dict] = {}
    try:
        with pinned(cores.server):
            server.start(timeout_s=120.0)
        plan = Plan(
            server.ws_url,
            server.http_url + "/metrics",
            args.chunk_ms,
            args.speakers,
            args.missed_after_s * 1000,
        )
        with pinned(cores.generators):
            for name, detection in detections(eagerness).items():
                print(f"bench turns: {name}, {len(turns)} turns", file=sys.stderr)
                phases[name] = _phase(plan, detection, turns)
            if clips:
                for name, detection in (
                    (BASELINE, detections([])[BASELINE]),
                    ("semantic_vad", {"type": "semantic_vad"}),
                ):
                    print(f"bench turns: backchannels, {name}", file=sys.stderr)
                    overlaps[name] = _overlaps(plan, detection, clips, question)
    finally:
        server.stop()
    base = phases[BASELINE]
    reasons = [r for name, p in {**phases, **overlaps}.items() for r in _reasons(name, p)]
    print(
        json.dumps(
            {
                "bench": "turns",
                "speakers": args.speakers,
                "turns": len(turns),
                "seed": args.seed,
                "chunk_ms": args.chunk_ms,
                "missed_after_s": args.missed_after_s,
                "cpu_count": os.cpu_count(),
                "pinning": cores.report(),
                "speech": {
                    **recorded_speech.source(),
                    "paused_turns": sum(t.paused for t in turns),
                    "seconds": round(sum(t.seconds for t in turns), 1),
                },
                **verdict(reasons),
                "baseline": BASELINE,
                "detections": detections(eagerness),
                "phases": phases,
                "ratios_vs_baseline": {
                    name: {
                        "early_turns": _ratio(p["early_turns"], base["early_turns"]),
                        "missed_turns": _ratio(p["missed_turns"], base["missed_turns"]),
                        "end_of_turn_delay_p50": _ratio(
                            p["end_of_turn_delay_ms"]["p50"], base["end_of_turn_delay_ms"]["p50"]
                        ),
                    }
                    for name, p in phases.items()
                    if name != BASELINE
                },
                "backchannels": overlaps,
                "targets": _targets(phases, overlaps),
            }
        )
    )
