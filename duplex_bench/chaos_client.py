"""The chaos bench's client: a streaming session that survives every fault and
remembers exactly what the server acknowledged.

A client streams audio, commits, acknowledges playback of every answer and
acknowledges the journal, as a voice app does. What it learns is kept in a
:class:`Witness`, which the audit later holds against the log:

- an input event counts as acknowledged once a ``session.heartbeat_ack``
  sent after it comes back without an ``error`` naming it (a
  ``duplicate_event`` says a re-sent one had landed): the actor applies
  one socket's commands in order and emits nothing for a command before its
  records are appended, so the ack proves the log has everything before it;
- every journaled event (``server_event_seq``) it received, in order, and
  any duplicate or gap in that sequence (the socket asks for ``events=both``,
  so the journal is contiguous);
- the conversation it saw (item ids in order) and the last turn id.

When the socket drops, it resumes from the last event it received, on any
of the servers it knows, retrying through outages, and re-sends every input
event not yet acknowledged with the same ``event_id``: the log applies a
retried id once. A refusal that says "try again" (``storage_unavailable``,
``resource_exhausted``) is retried; one that says the session is gone ends
the client, and the run reports it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import websockets

RETRYABLE_REFUSALS = ("storage_unavailable", "resource_exhausted", "rate_limited")
HANDSHAKE_TIMEOUT_S = 10.0
EVENT_ACK_EVERY = 32  # journaled events between session.event_ack
OUTPUT_BYTES_PER_MS = 48  # pcm16 at 24 kHz: the echo model's output


@dataclass
class Op:
    """One input event that must reach the log once: sent again, as it was,
    after every resume until a heartbeat proves it is there."""

    index: int
    event_id: str
    kind: str  # "audio", "commit" or "ack": the log record it becomes
    frame: str
    acknowledged_by: str = ""  # the heartbeat whose ack proved it logged


@dataclass
class Witness:
    """What one client knows the server acknowledged, and what it saw."""

    name: str
    session_id: str | None = None
    cursor: int = 0  # the last journaled event received
    seen: dict[int, str] = field(default_factory=dict)  # server_event_seq -> type
    duplicates: int = 0
    gaps: int = 0
    type_changes: int = 0  # a replayed seq whose type differs from the first copy
    acknowledged: list[Op] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    turn_id: int = 0
    closed: bool = False
    failure: str | None = None
    drops: int = 0
    resumes: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds to resume)
    acks_at: list[float] = field(default_factory=list)  # when each ack arrived (for the plot)


class Refused(Exception):
    """The server answered the handshake with an error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class ChaosClient:
    def __init__(
        self,
        name: str,
        urls: list[str],
        frame_pcm: bytes,
        *,
        chunk_ms: int,
        commit_every: int,
        heartbeat_every: int,
        clock_zero: float,
    ) -> None:
        self.w = Witness(name)
        self.urls = urls
        self._audio = base64.b64encode(frame_pcm).decode()
        self.chunk_ms = chunk_ms
        self.commit_every = commit_every
        self.heartbeat_every = heartbeat_every
        self.clock_zero = clock_zero
        self._token: str | None = None
        self._ids = itertools.count(1)
        self._pending: list[Op] = []
        # Per socket, one per heartbeat in flight: (its event_id, the last op index before it).
        self._markers: deque[tuple[str, int]] = deque()
        self._heartbeats = itertools.count(1)
        self._closing = False
        # What the reader wants sent (playback and journal acks). Only the
        # sender task writes, so ops are numbered in wire order, a heartbeat
        # never overtakes an op counted before it, and a reader is never
        # stuck behind a send the server is not reading.
        self._outbox: list[tuple[str | None, dict[str, Any]]] = []
        self._output_ms: dict[str, float] = {}
        self._ws: websockets.ClientConnection | None = None
        self._url_index = 0
        self._since_event_ack = 0

    # --- faults the driver injects ---------------------------------------------

    def drop(self) -> bool:
        """Cut the TCP connection under the socket, as a network would."""
        if self._ws is None or self._ws.transport is None:
            return False
        self._ws.transport.abort()
        return True

    # --- the session ------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        dropped_at: float | None = None
        backoff = 0.05
        while not stop.is_set():
            try:
                ws = await self._attach()
            except (OSError, TimeoutError, websockets.WebSocketException, Refused) as exc:
                if isinstance(exc, Refused) and exc.code not in RETRYABLE_REFUSALS:
                    self.w.failure = str(exc)
                    return
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            backoff = 0.05
            if dropped_at is not None:
                now = time.monotonic()
                self.w.resumes.append((now - self.clock_zero, now - dropped_at))
            try:
                await self._converse(ws, stop)
                return
            except (OSError, websockets.ConnectionClosed):
                self.w.drops += 1
                dropped_at = time.monotonic()
            finally:
                self._ws = None
                await ws.close()

    async def _attach(self) -> websockets.ClientConnection:
        url = self.urls[self._url_index % len(self.urls)]
        self._url_index += 1  # the next attempt tries the next server
        ws = await asyncio.wait_for(
            websockets.connect(
                url + "&autostart=0", max_size=None, ping_interval=None, open_timeout=5
            ),
            HANDSHAKE_TIMEOUT_S,
        )
        try:
            if self.w.session_id is None:
                await ws.send(json.dumps({"type": "session.update", "session": {}}))
                created = await self._handshake(ws, "session.created")
                self.w.session_id = created["session"]["id"]
            else:
                await ws.send(
                    json.dumps(
                        {
                            "type": "session.resume",
                            "session_id": self.w.session_id,
                            "resume_token": self._token,
                            "last_received_server_event_seq": self.w.cursor,
                        }
                    )
                )
                await self._handshake(ws, "session.resumed")
        except BaseException:
            await ws.close()
            raise
        self._url_index -= 1  # stay with the server that answered
        return ws

    async def _handshake(self, ws, expected: str) -> dict:
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), HANDSHAKE_TIMEOUT_S))
            if event["type"] == "error":
                raise Refused(event["error"]["code"], event["error"]["message"])
            if event["type"] == expected:
                self._token = event["resume_token"]
                return event

    async def _converse(self, ws, stop: asyncio.Event) -> None:
        self._ws = ws
        self._markers.clear()
        # What is in doubt after a drop goes first, in its order, before the
        # reader can answer the replay with new ops (the log keeps one copy).
        for op in list(self._pending):
            await ws.send(op.frame)
        reader = asyncio.create_task(self._read(ws))
        sender = asyncio.create_task(self._send(ws, stop))
        try:
            done, _ = await asyncio.wait({reader, sender}, return_when=asyncio.FIRST_COMPLETED)
            if sender in done:
                sender.result()  # a drop while sending raises here
                await reader  # to session.closed, or a drop
            else:
                reader.result()
        finally:
            for task in (reader, sender):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, websockets.ConnectionClosed):
                    await task
        if not self.w.closed:
            raise websockets.ConnectionClosedError(None, None)

    # --- sending ----------------------------------------------------------------

    async def _send(self, ws, stop: asyncio.Event) -> None:
        await self._heartbeat(ws)
        appends = 0
        while not stop.is_set():
            await asyncio.sleep(self.chunk_ms / 1000)
            await self._flush_outbox(ws)
            await self._op(ws, "audio", {"type": "input_audio_buffer.append", "audio": self._audio})
            appends += 1
            if appends % self.commit_every == 0:
                await self._op(ws, "commit", {"type": "input_audio_buffer.commit"})
            if appends % self.heartbeat_every == 0:
                await self._heartbeat(ws)
        await self._flush_outbox(ws)
        await self._heartbeat(ws)
        self._closing = True  # after session.close nothing more is asked of the session
        await ws.send(json.dumps({"type": "session.close"}))

    async def _flush_outbox(self, ws) -> None:
        outbox, self._outbox = self._outbox, []
        for kind, event in outbox:
            if kind is None:
                await ws.send(json.dumps(event))
            else:
                await self._op(ws, kind, event)

    async def _op(self, ws, kind: str, event: dict[str, Any]) -> None:
        index = next(self._ids)
        event_id = f"{self.w.name}-{index}"
        op = Op(index, event_id, kind, json.dumps({**event, "event_id": event_id}))
        self._pending.append(op)
        await ws.send(op.frame)

    async def _heartbeat(self, ws) -> None:
        event_id = f"{self.w.name}-hb{next(self._heartbeats)}"
        self._markers.append((event_id, self._pending[-1].index if self._pending else 0))
        await ws.send(json.dumps({"type": "session.heartbeat", "event_id": event_id}))

    # --- reading ----------------------------------------------------------------

    async def _read(self, ws) -> None:
        async for frame in ws:
            event = json.loads(frame)
            if self._journal(event.get("server_event_seq"), event["type"]):
                self._react(event)
            if self.w.closed:
                return

    def _journal(self, seq: int | None, kind: str) -> bool:
        """Note a journaled event; False for a copy already seen (not acted on twice)."""
        if seq is None:
            return True
        w = self.w
        if seq <= w.cursor:
            w.duplicates += 1
            if w.seen.get(seq, kind) != kind:
                w.type_changes += 1
            return False
        if seq != w.cursor + 1:
            w.gaps += 1
        w.seen[seq] = kind
        w.cursor = seq
        self._since_event_ack += 1
        return True

    def _react(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "session.heartbeat_ack" and self._markers:
            self._acknowledge(*self._markers.popleft())
        elif kind == "error" and event["error"]["code"] != "duplicate_event":
            # duplicate_event answers a re-sent op whose first send landed: it
            # stays pending, and the next heartbeat ack acknowledges it.
            self._refuse(event["error"].get("event_id"))
        elif kind == "conversation.item.added":
            self.w.items.append(event["item"]["id"])
        elif kind == "input_audio_buffer.committed":
            self.w.turn_id = event.get("event", {}).get("turn_id", self.w.turn_id)
        elif kind == "response.output_audio.delta":
            played = len(base64.b64decode(event["delta"])) / OUTPUT_BYTES_PER_MS
            self._output_ms[event["response_id"]] = (
                self._output_ms.get(event["response_id"], 0.0) + played
            )
        elif kind == "response.done":
            response_id = event["response"]["id"]
            played = self._output_ms.pop(response_id, 0.0)
            if not self._closing:
                self._outbox.append(
                    (
                        "ack",
                        {"type": "playback.ack", "response_id": response_id, "played_ms": played},
                    )
                )
        elif kind in ("session.closed", "session.expired"):
            self.w.closed = True
        if self._since_event_ack >= EVENT_ACK_EVERY:
            self._since_event_ack = 0
            self._outbox.append(
                (None, {"type": "session.event_ack", "server_event_seq": self.w.cursor})
            )

    def _acknowledge(self, heartbeat_id: str, upto_index: int) -> None:
        now = time.monotonic() - self.clock_zero
        while self._pending and self._pending[0].index <= upto_index:
            op = self._pending.pop(0)
            op.acknowledged_by = heartbeat_id
            self.w.acknowledged.append(op)
            self.w.acks_at.append(now)

    def _refuse(self, event_id: str | None) -> None:
        """An input event the server refused (an outage): the client takes it
        as not applied and does not send it again. A refused heartbeat
        acknowledges nothing: its marker goes."""
        for position, (heartbeat_id, _) in enumerate(self._markers):
            if heartbeat_id == event_id:
                del self._markers[position]
                return
        for position, op in enumerate(self._pending):
            if op.event_id == event_id:
                del self._pending[position]
                self.w.refused.append(op.event_id)
                return
