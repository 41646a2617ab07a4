"""One bench session as a client: a paced sender and a reader that timestamps
what the benches measure.

Its own module so that both sides of ``bench sessions`` can import it: the
bench process that runs the phases, and the generator processes
(``load_processes``) that run the clients. ``abuse`` and ``soak`` drive the
same client on their own event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
from dataclasses import dataclass, field

import numpy as np
import websockets

RENEW_TIMEOUT_S = 10.0  # for the server to close a session the client closed


def quantiles(samples: list[float]) -> dict[str, float | None]:
    if not samples:
        return {"p50": None, "p99": None}
    values = np.array(samples) * 1000.0
    return {
        "p50": round(float(np.percentile(values, 50)), 3),
        "p99": round(float(np.percentile(values, 99)), 3),
    }


@dataclass
class Measures:
    appends: int = 0
    heartbeat_rtt: list[float] = field(default_factory=list)
    commit_to_audio: list[float] = field(default_factory=list)
    errors: int = 0
    connect_failures: int = 0


def merged(parts: list[Measures]) -> Measures:
    """Several generator processes' measures as one: counts add up and the
    samples pool, so quantiles are taken over every session at once."""
    total = Measures()
    for part in parts:
        total.appends += part.appends
        total.heartbeat_rtt += part.heartbeat_rtt
        total.commit_to_audio += part.commit_to_audio
        total.errors += part.errors
        total.connect_failures += part.connect_failures
    return total


def append_frame(chunk_ms: int) -> str:
    """The append every bench client sends: ``chunk_ms`` of a 24 kHz tone."""
    pcm = np.sin(np.arange(24 * chunk_ms) / 24000 * 2 * np.pi * 440) * 6000
    audio = base64.b64encode(pcm.astype("<i2").tobytes()).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio})


class BenchClient:
    """One session: a paced sender and a reader that timestamps what matters.

    ``args`` needs ``chunk_ms`` and ``commit_every_s``."""

    def __init__(
        self,
        url: str,
        frame: str,
        args: argparse.Namespace,
        measures: Measures,
        deadline: float,
        measure_from: float,
    ) -> None:
        self.url = url
        self.frame = frame
        self.args = args
        self.m = measures
        self.deadline = deadline
        self.measure_from = measure_from
        self.heartbeat_sent: float | None = None
        self.commit_sent: float | None = None
        self.last_seq = 0
        self._renewing = False

    def _measuring(self, now: float) -> bool:
        return now >= self.measure_from

    def renew(self) -> None:
        """Close this session at the next tick and go on in a fresh one: a
        bench that compares windows starts each from sessions of one age
        (a live session's log, and so the server's memory, grows as it talks)."""
        self._renewing = True

    async def run(self, start_delay: float) -> None:
        await asyncio.sleep(start_delay)
        while True:
            self._renewing = False
            self.heartbeat_sent = self.commit_sent = None
            self.last_seq = 0
            try:
                await self._session()
            except (OSError, websockets.WebSocketException):
                self.m.connect_failures += 1
                return
            if not self._renewing:
                return

    async def _session(self) -> None:
        async with websockets.connect(self.url, max_size=None, ping_interval=None) as ws:
            await ws.recv()  # session.created
            reader = asyncio.create_task(self._read(ws))
            await self._send(ws)
            if self._renewing:
                await ws.send('{"type":"session.close"}')
                await asyncio.wait({reader}, timeout=RENEW_TIMEOUT_S)  # the server closes
            reader.cancel()

    async def _send(self, ws) -> None:
        loop = asyncio.get_running_loop()
        period = self.args.chunk_ms / 1000.0
        per_commit = max(1, round(self.args.commit_every_s / period))
        per_heartbeat = max(1, round(1.0 / period))
        tick = 0
        next_at = loop.time()
        while (now := loop.time()) < self.deadline and not self._renewing:
            await ws.send(self.frame)
            if self._measuring(now):
                self.m.appends += 1
            tick += 1
            if tick % per_commit == 0:
                self.commit_sent = loop.time()
                await ws.send('{"type":"input_audio_buffer.commit"}')
                if self.last_seq:
                    await ws.send(
                        json.dumps({"type": "session.event_ack", "server_event_seq": self.last_seq})
                    )
            if tick % per_heartbeat == 0 and self.heartbeat_sent is None:
                self.heartbeat_sent = loop.time()
                await ws.send('{"type":"session.heartbeat"}')
            next_at += period
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def _read(self, ws) -> None:
        loop = asyncio.get_running_loop()
        async for frame in ws:
            now = loop.time()
            # Server frames start with their type (msgspec writes the tag first),
            # so the reader avoids parsing every audio delta.
            head = frame[:48]
            if '"session.heartbeat_ack"' in head and self.heartbeat_sent is not None:
                if self._measuring(now):
                    self.m.heartbeat_rtt.append(now - self.heartbeat_sent)
                self.heartbeat_sent = None
            elif '"response.output_audio.delta"' in head and self.commit_sent is not None:
                if self._measuring(now):
                    self.m.commit_to_audio.append(now - self.commit_sent)
                self.commit_sent = None
            elif '"rate_limits.updated"' in head:
                self.last_seq = json.loads(frame).get("server_event_seq") or self.last_seq
            elif '"error"' in head:
                self.m.errors += 1
