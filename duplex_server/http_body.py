"""A request body read under a bound: refused the moment it passes it.

Shared by every HTTP route that reads a body (the batch API's uploads and
JSON, Twilio's voice webhook), so that none holds an oversized body whole.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from starlette.requests import Request


class BodyTooLarge(Exception):
    pass


async def limited_stream(request: Request, limit: int) -> AsyncGenerator[bytes, None]:
    """The request body as it arrives, refused (:class:`BodyTooLarge`) the
    moment it passes ``limit`` bytes: an oversized upload is never held."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(int(declared))
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            raise BodyTooLarge(seen)
        yield chunk


async def read_limited(request: Request, limit: int) -> bytes:
    """The whole body, at most ``limit`` bytes (:class:`BodyTooLarge` past it)."""
    return b"".join([chunk async for chunk in limited_stream(request, limit)])
