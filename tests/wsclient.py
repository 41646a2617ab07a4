"""A small raw WebSocket client for tests: send dicts, read typed dicts."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import websockets

RECV_TIMEOUT_S = 10.0


def tone_pcm16(ms: float, rate: int = 24_000, freq: float = 440.0, amp: int = 8000) -> bytes:
    t = np.arange(int(rate * ms / 1000)) / rate
    return (np.sin(2 * np.pi * freq * t) * amp).astype("<i2").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class WsClient:
    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.received: list[dict[str, Any]] = []

    @classmethod
    async def connect(cls, url: str, **kwargs: Any) -> WsClient:
        ws = await websockets.connect(url, max_size=None, **kwargs)
        return cls(ws)

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def send_raw(self, frame: str | bytes) -> None:
        await self.ws.send(frame)

    async def recv(self, timeout: float = RECV_TIMEOUT_S) -> dict[str, Any]:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.received.append(event)
        return event

    async def recv_until(self, *types: str, timeout: float = RECV_TIMEOUT_S) -> list[dict]:
        """Events up to and including the first of ``types``."""
        out = []
        while True:
            event = await self.recv(timeout)
            out.append(event)
            if event["type"] in types:
                return out

    async def expect(self, event_type: str) -> dict[str, Any]:
        event = await self.recv()
        assert event["type"] == event_type, f"expected {event_type}, got {event}"
        return event

    async def append(self, pcm: bytes, **extra: Any) -> None:
        await self.send({"type": "input_audio_buffer.append", "audio": b64(pcm), **extra})

    async def close(self) -> None:
        await self.ws.close()


def types_of(events: list[dict]) -> list[str]:
    return [event["type"] for event in events]
