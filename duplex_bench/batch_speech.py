"""``bench batch``'s speech part: ``POST /v1/audio/speech`` with
``stream_format=audio``, one request at a time on an otherwise idle server.

First byte: request sent -> the first body chunk (the first clause,
synthesised and encoded). Real-time factor: the whole response's wall time
over the seconds of audio it carried (below 1: faster than it plays)."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np

ROUTE = "/v1/audio/speech"
SPEECH_TEXT = (
    "The quick brown fox jumps over the lazy dog. "
    "A batch request streams its audio as each clause is synthesised, "
    "so the first bytes leave long before the last sentence is spoken."
)
SAMPLE_RATE_HZ = 24_000  # the route's default rate; the bench asks for no other


async def time_speech(url: str, requests: int, response_format: str) -> dict:
    body = {
        "model": "tts-1",
        "voice": "alloy",
        "input": SPEECH_TEXT,
        "response_format": response_format,
        "stream_format": "audio",
    }
    first_bytes: list[float] = []
    factors: list[float] = []
    audio_s = 0.0
    async with httpx.AsyncClient(timeout=300) as http:
        for _ in range(requests):
            sent = time.perf_counter()
            chunks: list[bytes] = []
            async with http.stream("POST", url + ROUTE, json=body) as reply:
                reply.raise_for_status()
                async for chunk in reply.aiter_bytes():
                    if not chunks:
                        first_bytes.append(time.perf_counter() - sent)
                    chunks.append(chunk)
            wall = time.perf_counter() - sent
            audio_s = await asyncio.to_thread(seconds_of, b"".join(chunks), response_format)
            factors.append(wall / audio_s)
    return {
        "requests": requests,
        "response_format": response_format,
        "audio_s_per_request": round(audio_s, 2),
        "first_byte": ms(first_bytes),
        "real_time_factor_p50": round(float(np.percentile(factors, 50)), 3),
        "real_time_factor_max": round(max(factors), 3),
    }


def seconds_of(body: bytes, response_format: str) -> float:
    from duplex_server.surface import decode_audio  # PyAV: loaded when used

    pcm = body if response_format == "pcm" else decode_audio(body, SAMPLE_RATE_HZ, 3600)
    return len(pcm) / 2 / SAMPLE_RATE_HZ


def ms(values: list[float]) -> dict[str, float | int]:
    """Latency percentiles in milliseconds."""
    data = np.array(values) * 1000
    return {
        "count": len(values),
        "p50_ms": round(float(np.percentile(data, 50)), 1),
        "p95_ms": round(float(np.percentile(data, 95)), 1),
        "p99_ms": round(float(np.percentile(data, 99)), 1),
        "max_ms": round(float(data.max()), 1),
    }
