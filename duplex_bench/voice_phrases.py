"""``duplex-server bench voice --phrases``: spoken turns and barge-ins
against the cascade model in its phrase-grammar mode.

N clients each speak a question (eSpeak NG speech, streamed in real time in
``chunk_ms`` chunks, server VAD on), listen to part of the answer and talk
over it, then ask again. Measured, client side: the VAD's
``speech_stopped`` -> first answer audio, speech end -> first answer audio,
barge-in onset and threshold crossing -> ``response.done`` cancelled, and
gaps in the answer audio played at real time behind a jitter buffer. Server
side: CPU per session. Stage real-time factors (ASR, TTS) are timed on the
same phrases in this process. The baseline, measured in the same run, is the
``echo`` model answering the same audio committed by the client.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import websockets

from duplex_bench.generator import GeneratorCpu, validity
from duplex_bench.server_process import ServerProcess
from duplex_server.surface import BARGE_IN_MS, resample_pcm16

RATE = 24_000
JITTER_MS = 120.0
PHRASES = ["turn on the lights please", "what time is it", "open the door", "play some music"]
VOICE = "en-us+f3"
TARGET_FIRST_AUDIO_P95_MS = 250.0
TARGET_BARGE_IN_MS = 150.0
TARGET_TTS_RTF = 0.05


@dataclass
class VoiceMeasures:
    stopped_to_audio: list[float] = field(default_factory=list)
    speech_end_to_audio: list[float] = field(default_factory=list)
    onset_to_cancel: list[float] = field(default_factory=list)
    threshold_to_cancel: list[float] = field(default_factory=list)
    underruns: int = 0
    answers: int = 0
    misheard: int = 0
    # Where speech_stopped -> first audio went: the client's timeline of each
    # answered turn (seconds) and its response.done stage metrics (ms).
    timeline: dict[str, list[float]] = field(default_factory=dict)
    stages: dict[str, list[float]] = field(default_factory=dict)

    def mark(self, name: str, seconds: float) -> None:
        self.timeline.setdefault(name, []).append(seconds)

    def staged(self, response: dict) -> None:
        figures = (response.get("duplex") or {}).get("stage_metrics") or {}
        for name, ms in figures.items():
            self.stages.setdefault(name, []).append(ms / 1000)

    def breakdown(self) -> dict:
        return {
            "client_timeline_ms": {k: _p50_p95(v) for k, v in self.timeline.items()},
            "stage_metrics_ms": {k: _p50_p95(v) for k, v in sorted(self.stages.items())},
        }


def _speech(text: str) -> bytes:
    from duplex_server.surface import Espeak

    espeak = Espeak.shared()
    return resample_pcm16(espeak.synthesize(text, VOICE), espeak.sample_rate_hz, RATE)


class Speaker:
    """One session: a paced microphone and a reader that timestamps events."""

    def __init__(self, url: str, chunk_ms: int, measures: VoiceMeasures) -> None:
        self.url = url
        self.chunk_ms = chunk_ms
        self.m = measures
        self.events: asyncio.Queue[tuple[float, dict]] = asyncio.Queue()

    async def _send_paced(self, ws, pcm: bytes) -> float:
        """Stream ``pcm`` at real time; returns when its last chunk was sent."""
        loop = asyncio.get_running_loop()
        step = RATE * self.chunk_ms // 1000 * 2
        next_at = loop.time()
        for at in range(0, len(pcm), step):
            chunk = base64.b64encode(pcm[at : at + step]).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            next_at += self.chunk_ms / 1000
            await asyncio.sleep(max(0.0, next_at - loop.time()))
        return loop.time()

    async def _read(self, ws) -> None:
        loop = asyncio.get_running_loop()
        async for frame in ws:
            await self.events.put((loop.time(), json.loads(frame)))

    async def _until(self, *types: str) -> tuple[float, dict]:
        while True:
            at, event = await asyncio.wait_for(self.events.get(), 30)
            if event["type"] in types:
                return at, event

    async def run(self, turns: int, offset: int) -> None:
        async with websockets.connect(self.url, max_size=None) as ws:
            reader = asyncio.create_task(self._read(ws))
            await self._until("session.created")
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {"turn_detection": {"type": "server_vad"}},
                    }
                )
            )
            await self._until("session.updated")
            silence = b"\0\0" * (RATE // 2)
            for turn in range(turns):
                phrase = PHRASES[(offset + turn) % len(PHRASES)]
                await self._turn(ws, phrase, silence)
            reader.cancel()

    async def _turn(self, ws, phrase: str, silence: bytes) -> None:
        speech = _speech(phrase)
        await self._send_paced(ws, silence)
        speech_end = await self._send_paced(ws, speech)
        sender = asyncio.create_task(self._send_paced(ws, silence * 3))
        stopped_at, _ = await self._until("input_audio_buffer.speech_stopped")
        heard_at, heard = await self._until("conversation.item.input_audio_transcription.completed")
        self.m.misheard += heard["transcript"] != phrase
        created_at, _ = await self._until("response.created")
        first_at, first = await self._until("response.output_audio.delta")
        self.m.mark("stopped_to_transcript", heard_at - stopped_at)
        self.m.mark("transcript_to_response_created", created_at - heard_at)
        self.m.mark("response_created_to_first_audio", first_at - created_at)
        self.m.stopped_to_audio.append(first_at - stopped_at)
        self.m.speech_end_to_audio.append(first_at - speech_end)
        sender.cancel()  # the microphone's silence; the barge-in speech follows
        await self._listen_then_barge_in(ws, first_at, first)

    async def _listen_then_barge_in(self, ws, first_at: float, first: dict) -> None:
        """Play the answer at real time behind a jitter buffer (counting gaps),
        then talk over it and time the cancellation."""
        played_until = first_at + JITTER_MS / 1000
        scheduled = len(base64.b64decode(first["delta"])) / (2 * RATE)
        barge = asyncio.create_task(self._barge_in(ws, first_at + 0.3))
        while True:
            at, event = await self._until("response.output_audio.delta", "response.done")
            if event["type"] == "response.done":
                break
            if at > played_until + scheduled:
                self.m.underruns += 1
                played_until, scheduled = at, 0.0
            scheduled += len(base64.b64decode(event["delta"])) / (2 * RATE)
        onset, threshold = await barge
        self.m.staged(event["response"])
        if event["response"]["status"] == "cancelled":
            self.m.onset_to_cancel.append(at - onset)
            self.m.threshold_to_cancel.append(at - threshold)
        self.m.answers += 1
        await self._until("response.done")  # the answer to the barge-in turn
        self.m.answers += 1

    async def _barge_in(self, ws, at: float) -> tuple[float, float]:
        await asyncio.sleep(max(0.0, at - asyncio.get_running_loop().time()))
        onset = asyncio.get_running_loop().time()
        speech = _speech(PHRASES[0])
        await self._send_paced(ws, speech + b"\0\0" * RATE)
        return onset, onset + BARGE_IN_MS / 1000


def _stage_rtf() -> dict:
    from duplex_server.surface import Espeak, Sphinx

    espeak = Espeak.shared()
    sphinx = Sphinx(PHRASES)
    tts_s = asr_s = answer_audio_s = question_audio_s = 0.0
    for phrase in PHRASES * 3:
        started = time.perf_counter()
        pcm = espeak.synthesize(f"You said: {phrase}.", VOICE)
        tts_s += time.perf_counter() - started
        answer_audio_s += len(pcm) / (2 * espeak.sample_rate_hz)
        speech = resample_pcm16(espeak.synthesize(phrase, VOICE), espeak.sample_rate_hz, 16_000)
        question_audio_s += len(speech) / (2 * 16_000)
        started = time.perf_counter()
        sphinx.transcribe(speech)
        asr_s += time.perf_counter() - started
    return {
        "tts_rtf": round(tts_s / answer_audio_s, 4),
        "asr_rtf": round(asr_s / question_audio_s, 4),
    }


async def _drive(url: str, args: argparse.Namespace, proc: psutil.Process) -> dict:
    measures = VoiceMeasures()
    generator = GeneratorCpu()
    generator.start()
    proc.cpu_percent(None)
    started = time.perf_counter()
    speakers = [Speaker(url, args.chunk_ms, measures) for _ in range(args.sessions)]
    await asyncio.gather(*(s.run(args.turns, i) for i, s in enumerate(speakers)))
    cpu = proc.cpu_percent(None)
    return {
        **generator.report(),
        "vad_stopped_to_first_audio_ms": _p50_p95(measures.stopped_to_audio),
        "speech_end_to_first_audio_ms": _p50_p95(measures.speech_end_to_audio),
        "barge_in_onset_to_cancel_ms": _p50_p95(measures.onset_to_cancel),
        "barge_in_threshold_to_cancel_ms": _p50_p95(measures.threshold_to_cancel),
        "audio_underruns": measures.underruns,
        "answers": measures.answers,
        "misheard_turns": measures.misheard,
        "server_cpu_percent_per_session": round(cpu / args.sessions, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "breakdown": measures.breakdown(),
    }


def _p50_p95(samples: list[float]) -> dict:
    if not samples:
        return {"p50": None, "p95": None, "n": 0}
    values = np.array(samples) * 1000
    return {
        "p50": round(float(np.percentile(values, 50)), 1),
        "p95": round(float(np.percentile(values, 95)), 1),
        "n": len(samples),
    }


async def _echo_baseline(url: str, args: argparse.Namespace) -> dict:
    """The same questions to the echo model, committed by the client at speech
    end: the latency of the session core alone (no VAD, ASR or TTS)."""
    latencies: list[float] = []
    generator = GeneratorCpu()
    generator.start()

    async def one(offset: int) -> None:
        speaker = Speaker(url, args.chunk_ms, VoiceMeasures())
        async with websockets.connect(url, max_size=None) as ws:
            reader = asyncio.create_task(speaker._read(ws))
            await speaker._until("session.created")
            for turn in range(args.turns):
                speech = _speech(PHRASES[(offset + turn) % len(PHRASES)])
                end = await speaker._send_paced(ws, speech)
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                at, _ = await speaker._until("response.output_audio.delta")
                latencies.append(at - end)
                await speaker._until("response.done")
            reader.cancel()

    await asyncio.gather(*(one(i) for i in range(args.sessions)))
    return {"speech_end_to_first_audio_ms": _p50_p95(latencies), **generator.report()}


def _with_server(model: str, phrases: Path | None, drive) -> dict:
    server = ServerProcess("memory", model=model, asr_phrases=phrases)
    try:
        server.start()
        return asyncio.run(drive(server.ws_url, server))
    finally:
        server.stop()


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        phrases = Path(tmp) / "phrases.txt"
        phrases.write_text("\n".join(PHRASES))
        baseline = _with_server("echo", phrases, lambda url, server: _echo_baseline(url, args))
        ours = _with_server(
            "cascade",
            phrases,
            lambda url, server: _drive(url, args, psutil.Process(server.pid)),
        )
    base_p50 = baseline["speech_end_to_first_audio_ms"]["p50"]
    ours_p50 = ours["speech_end_to_first_audio_ms"]["p50"]
    stages = _stage_rtf()
    first = ours["vad_stopped_to_first_audio_ms"]["p95"]
    cancel = ours["barge_in_threshold_to_cancel_ms"]["p95"]
    print(
        json.dumps(
            {
                "bench": "voice",
                "sessions": args.sessions,
                "turns": args.turns,
                "chunk_ms": args.chunk_ms,
                "asr_vocabulary": "phrases",
                "cpu_count": os.cpu_count(),
                **validity(ours, baseline),
                **ours,
                **stages,
                "baseline_echo_client_commit": baseline,
                "speech_end_to_first_audio_p50_ratio_vs_echo": round(ours_p50 / base_p50, 2)
                if ours_p50 and base_p50
                else None,
                "targets": {
                    "first_audio_p95_under_250ms": first is not None
                    and first < TARGET_FIRST_AUDIO_P95_MS,
                    "barge_in_cancel_p95_under_150ms": cancel is not None
                    and cancel < TARGET_BARGE_IN_MS,
                    "tts_rtf_under_0_05": stages["tts_rtf"] < TARGET_TTS_RTF,
                    "no_underruns": ours["audio_underruns"] == 0,
                },
            }
        )
    )
