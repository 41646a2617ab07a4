"""``DuplexClient``: the asyncio shell around :class:`Demux`.

One reader task owns the socket's receive side: it feeds frames to the demux,
queues typed events for ``events()``, resolves waiters, acks the journal, and
on a transport drop reconnects and resumes the session (jittered exponential
backoff), so callers see one continuous stream plus a ``ConnectionResumed``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgspec
import websockets

from clients.duplex.demux import ConnectionResumed, Demux, ResponseView, listen_key
from clients.duplex.errors import (
    DuplexConnectionError,
    DuplexProtocolError,
    DuplexSessionClosedError,
)
from clients.duplex.trace import DuplexTrace
from protocol import server_events as se
from protocol.close_codes import CloseCode
from protocol.session_config import SessionUpdate

SessionConfig = SessionUpdate
DEFAULT_TIMEOUT_S = 10.0
_END = object()


@dataclass
class ReconnectPolicy:
    max_attempts: int = 8
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    jitter: float = 0.5  # each wait is scaled by a random factor in [1 - jitter, 1]

    def delays(self) -> list[float]:
        out, delay = [], self.initial_backoff_s
        for _ in range(self.max_attempts):
            out.append(delay * (1 - self.jitter * random.random()))
            delay = min(self.max_backoff_s, delay * 2)
        return out


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(params)
    return urlunsplit(parts._replace(query=urlencode(query)))


class ResponseHandle:
    """One assistant response (or listen decision) as it unfolds."""

    def __init__(self, client: DuplexClient, view: ResponseView) -> None:
        self._client = client
        self._view = view
        self._audio_sent = 0

    @property
    def response_id(self) -> str:
        return self._view.response_id

    @property
    def decision(self) -> str:
        return self._view.decision

    @property
    def status(self) -> str:
        return self._view.status

    @property
    def reason(self) -> str | None:
        return self._view.reason

    @property
    def transcript(self) -> str:
        return self._view.transcript

    @property
    def text(self) -> str:
        return self._view.text

    @property
    def played_ms(self) -> float:
        return self._view.played_ms

    @property
    def audio_format(self) -> str:
        """Wire format of ``audio_bytes`` (as the deltas declared it)."""
        return self._view.audio_format

    @property
    def sample_rate_hz(self) -> int:
        return self._view.sample_rate_hz

    @property
    def audio_bytes(self) -> bytes:
        return b"".join(self._view.audio)

    async def audio(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> AsyncIterator[bytes]:
        """Audio chunks as they arrive, until the response is done."""
        while True:
            while self._audio_sent < len(self._view.audio):
                self._audio_sent += 1
                yield self._view.audio[self._audio_sent - 1]
            if self._view.done:
                return
            await self._client._changed(timeout_s)

    async def wait(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> ResponseHandle:
        deadline = time.monotonic() + timeout_s
        while not self._view.done:
            await self._client._changed(max(0.0, deadline - time.monotonic()))
        return self


class DuplexClient:
    def __init__(
        self,
        url: str,
        model: str | None = None,
        config: SessionConfig | None = None,
        reconnect: ReconnectPolicy | None = ReconnectPolicy(),  # noqa: B008 - immutable use
        heartbeat_interval_s: float | None = 30.0,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        trace: DuplexTrace | None = None,
        ack_every: int = 32,
        replicas: Sequence[str] = (),
    ) -> None:
        """``replicas``: other servers of the same deployment (one Redis); a
        dropped connection is resumed on them in turn when ``url`` is gone."""
        self.url = url
        self.replicas = list(replicas)
        self.config = config or SessionConfig()
        if model is not None:
            self.config = msgspec.structs.replace(self.config, model=model)
        self.reconnect = reconnect
        self.heartbeat_interval_s = heartbeat_interval_s
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.trace = trace
        self.ack_every = ack_every
        self.session_id: str | None = None
        self.session: se.SessionObject | None = None
        self.resume_token: str | None = None
        self.closed_reason: str | None = None
        self._demux = Demux()
        self._ws: websockets.ClientConnection | None = None
        self._events: asyncio.Queue[Any] = asyncio.Queue()
        self._listeners: list[Callable[[Any], None]] = []
        # Ids sent again after a drop: the server's duplicate_event for one of
        # them says the first send landed, which is what a retry hopes for.
        self._retried: set[str] = set()
        self._change = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        self._acked = 0
        self._failure: BaseException | None = None

    # --- lifecycle -----------------------------------------------------------

    async def __aenter__(self) -> DuplexClient:
        self._ws = await self._connect()
        await self._send_now(
            {"type": "session.update", "session": msgspec.to_builtins(self.config)}
        )
        created = await self._handshake(self._ws, se.SessionCreated)
        self.session_id = created.session.id if created.session else None
        self.session = created.session
        self.resume_token = created.resume_token
        self._deliver(created)
        self._reader = asyncio.create_task(self._read_forever())
        if self.heartbeat_interval_s:
            self._heartbeat = asyncio.create_task(self._beat())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            if self.closed_reason is None and self._ws is not None:
                with contextlib.suppress(*DuplexClientErrorTypes):
                    await self.send({"type": "session.close"})
                    await self.wait_for("session.closed", timeout_s=self.timeout_s)
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        for task in (self._heartbeat, self._reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._ws is not None:
            await self._ws.close()

    async def _connect(self, url: str | None = None) -> websockets.ClientConnection:
        url = url or self.url
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        try:
            return await asyncio.wait_for(
                websockets.connect(
                    _with_query(url, autostart="0"),
                    max_size=None,
                    additional_headers=headers,
                    ping_interval=None,
                ),
                self.timeout_s,
            )
        except (TimeoutError, OSError, websockets.WebSocketException) as exc:
            raise DuplexConnectionError(f"cannot connect to {url}: {exc}") from exc

    async def _handshake(self, ws, expected: type[msgspec.Struct]) -> Any:
        """Read until ``expected`` (session.created / session.resumed) or an error."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                frame = await asyncio.wait_for(ws.recv(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise DuplexConnectionError(
                    f"no {expected.__struct_config__.tag} within {self.timeout_s} s"
                ) from None
            except websockets.ConnectionClosed as exc:
                raise DuplexConnectionError(f"server closed during the handshake: {exc}") from exc
            self._trace("in", frame)
            event = self._demux.feed(frame)
            if isinstance(event, se.Error) and event.error is not None:
                raise _protocol_error(event.error)
            if isinstance(event, expected):
                return event
            if event is not None:
                self._deliver(event)

    # --- reading -------------------------------------------------------------

    async def _read_forever(self) -> None:
        try:
            while True:
                try:
                    frame = await self._connection().recv()
                except websockets.ConnectionClosed as exc:
                    if self.closed_reason is not None:
                        break
                    if exc.rcvd is not None and exc.rcvd.code == CloseCode.REPLACED:
                        self._fail(DuplexSessionClosedError("replaced"))
                        break
                    await self._resume_or_fail(exc)
                    continue
                self._trace("in", frame)
                event = self._demux.feed(frame)
                if event is not None and not self._answers_a_retry(event):
                    self._deliver(event)
                    await self._maybe_ack()
        except DuplexProtocolError as exc:
            self._fail(exc)
        except DuplexClientErrorTypes as exc:
            self._fail(exc)
        finally:
            self._events.put_nowait(_END)
            self._wake()

    def _answers_a_retry(self, event: Any) -> bool:
        error = event.error if isinstance(event, se.Error) else None
        if error is None or error.code != "duplicate_event" or error.event_id not in self._retried:
            return False
        self._retried.discard(error.event_id)
        return True

    def _deliver(self, event: Any) -> None:
        if isinstance(event, se.SessionClosed | se.SessionExpired):
            self.closed_reason = event.reason
        elif isinstance(event, se.SessionReplaced):
            self.closed_reason = "replaced"
        self._events.put_nowait(event)
        for listener in list(self._listeners):
            listener(event)
        self._wake()

    async def _maybe_ack(self) -> None:
        if self._demux.last_seq - self._acked >= self.ack_every:
            self._acked = self._demux.last_seq
            await self._send_now({"type": "session.event_ack", "server_event_seq": self._acked})

    async def _resume_or_fail(self, cause: Exception) -> None:
        if self.reconnect is None:
            raise DuplexSessionClosedError(f"transport dropped ({cause})")
        servers = [self.url, *(u for u in self.replicas if u != self.url)]
        for attempt, delay in enumerate(self.reconnect.delays()):
            await asyncio.sleep(delay)
            url = servers[attempt % len(servers)]
            try:
                ws = await self._connect(url)
            except DuplexConnectionError:
                continue
            self._demux.expect_replay(self._demux.last_seq)
            await ws.send(
                json.dumps(
                    {
                        "type": "session.resume",
                        "session_id": self.session_id,
                        "resume_token": self.resume_token,
                        "last_received_server_event_seq": self._demux.last_seq,
                    }
                )
            )
            try:
                resumed = await self._handshake(ws, se.SessionResumed)
            except DuplexProtocolError as exc:
                await ws.close()
                raise DuplexSessionClosedError(f"resume refused: {exc.code}") from exc
            except DuplexConnectionError:
                await ws.close()
                continue
            self._ws = ws
            if url != self.url:  # served by another replica from now on
                self.replicas = [self.url, *(u for u in self.replicas if u != url)]
                self.url = url
            self.resume_token = resumed.resume_token
            self.session = resumed.session or self.session
            self._deliver(resumed)
            self._deliver(
                ConnectionResumed(
                    attachment_generation=resumed.attachment_generation,
                    replay_from_seq=resumed.replay_from_seq,
                    replay_to_seq=resumed.replay_to_seq,
                )
            )
            return
        raise DuplexConnectionError(f"could not reconnect after {cause}")

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        if isinstance(exc, DuplexSessionClosedError) and self.closed_reason is None:
            self.closed_reason = exc.reason

    def _wake(self) -> None:
        self._change.set()
        self._change = asyncio.Event()

    async def _changed(self, timeout_s: float) -> None:
        if self._failure is not None:
            raise self._failure
        change = self._change
        try:
            await asyncio.wait_for(change.wait(), timeout_s)
        except TimeoutError:
            raise TimeoutError(f"nothing happened within {timeout_s} s") from None
        if self._failure is not None:
            raise self._failure

    async def _beat(self) -> None:
        while True:
            # started only when heartbeat_interval_s is set
            await asyncio.sleep(self.heartbeat_interval_s or 0.0)
            with contextlib.suppress(*DuplexClientErrorTypes):
                await self._send_now({"type": "session.heartbeat"})

    # --- sending -------------------------------------------------------------

    def _trace(self, direction: str, frame: str | bytes) -> None:
        if self.trace is not None:
            self.trace.record(direction, frame)

    async def _send_now(self, event: dict[str, Any]) -> None:
        frame = json.dumps(event)
        self._trace("out", frame)
        try:
            await self._connection().send(frame)
        except websockets.ConnectionClosed as exc:
            if self.reconnect is None:
                raise DuplexSessionClosedError(f"transport dropped ({exc})") from exc
            # The reader is resuming; a retry with the same event_id is applied
            # once (if the first send landed, the server says duplicate_event).
            await self._await_reconnect()
            if "event_id" in event:
                self._retried.add(event["event_id"])
            await self._connection().send(frame)

    def _connection(self) -> websockets.ClientConnection:
        """The socket; a DuplexConnectionError before connect() made one."""
        if self._ws is None:
            raise DuplexConnectionError("not connected: use `async with DuplexClient(...)`")
        return self._ws

    async def _await_reconnect(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while self._ws is None or self._ws.state != websockets.protocol.State.OPEN:
            await self._changed(max(0.0, deadline - time.monotonic()))

    async def send(self, event: dict[str, Any]) -> str:
        """Send a raw client event; returns its (stamped) ``event_id``."""
        if self._failure is not None:
            raise self._failure
        event = dict(event)
        event.setdefault("event_id", f"c_{self._prefix}_{next(self._ids)}")
        await self._send_now(event)
        return event["event_id"]

    async def _call(self, event: dict[str, Any], *done: str, timeout_s: float | None = None) -> Any:
        """Send and wait for the first of ``done`` or the error naming this event."""
        waiter = self._waiter(done)
        event_id = await self.send(event)
        return await waiter(event_id, timeout_s or self.timeout_s)

    def _waiter(self, types: tuple[str, ...]):
        seen: list[Any] = []

        def listen(event: Any) -> None:
            seen.append(event)

        self._listeners.append(listen)

        async def wait(event_id: str | None, timeout_s: float) -> Any:
            deadline = time.monotonic() + timeout_s
            try:
                while True:
                    while seen:
                        event = seen.pop(0)
                        if (
                            isinstance(event, se.Error)
                            and event.error is not None
                            and (event.error.event_id in (event_id, None))
                        ):
                            raise _protocol_error(event.error)
                        if getattr(event, "type", None) in types or _tag(event) in types:
                            return event
                    await self._changed(max(0.0, deadline - time.monotonic()))
            finally:
                self._listeners.remove(listen)

        return wait

    async def append_audio(self, pcm: bytes, **extra: Any) -> str:
        return await self.send(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode(), **extra}
        )

    async def stream_pcm(
        self, pcm: bytes, chunk_ms: int = 100, realtime: bool = True, sample_rate_hz: int = 24_000
    ) -> None:
        """Append ``pcm`` in ``chunk_ms`` pieces, paced like a microphone if ``realtime``."""
        step = sample_rate_hz * chunk_ms // 1000 * 2
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        for offset in range(0, len(pcm), step):
            await self.append_audio(pcm[offset : offset + step])
            if realtime:
                next_at += chunk_ms / 1000
                await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def commit(self, create_response: bool | None = None) -> se.InputCommitted:
        event: dict[str, Any] = {"type": "input_audio_buffer.commit"}
        if create_response is not None:
            event["response_create"] = create_response
        return await self._call(event, "input_audio_buffer.committed", "response.listen")

    async def create_response(self, **overrides: Any) -> se.ResponseCreated:
        event: dict[str, Any] = {"type": "response.create"}
        if overrides:
            event["response"] = overrides
        return await self._call(event, "response.created")

    async def cancel_response(self, response_id: str | None = None) -> se.ResponseDone:
        event: dict[str, Any] = {"type": "response.cancel"}
        if response_id:
            event["response_id"] = response_id
        return await self._call(event, "response.done")

    async def clear_input(self) -> se.InputCleared:
        return await self._call({"type": "input_audio_buffer.clear"}, "input_audio_buffer.cleared")

    async def barge_in(self) -> se.OutputAudioCleared:
        return await self._call({"type": "barge_in"}, "output_audio_buffer.cleared")

    async def ack_playback(
        self, played_ms: float, response_id: str | None = None
    ) -> se.PlaybackAcknowledged:
        event: dict[str, Any] = {"type": "playback.ack", "played_ms": played_ms}
        if response_id:
            event["response_id"] = response_id
        return await self._call(event, "playback.acknowledged")

    # --- reading, for callers ------------------------------------------------

    def add_listener(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(event)`` for every event as it is read (e.g. an
        ``EventCollector.add``); it runs on the reader task and must not block."""
        self._listeners.append(callback)

    async def events(self, timeout_s: float | None = None) -> AsyncIterator[Any]:
        """Typed events (GA spellings, replays removed), ``ConnectionResumed`` included."""
        while True:
            try:
                event = await asyncio.wait_for(self._events.get(), timeout_s)
            except TimeoutError:
                raise TimeoutError(f"no event within {timeout_s} s") from None
            if event is _END:
                self._events.put_nowait(_END)
                if self._failure is not None:
                    raise self._failure
                return
            yield event

    async def responses(self, timeout_s: float | None = None) -> AsyncIterator[ResponseHandle]:
        """One handle per assistant response or listen decision, in order."""
        async for event in self.events(timeout_s):
            if isinstance(event, se.ResponseCreated) and event.response is not None:
                yield ResponseHandle(self, self._demux.responses[event.response.id])
            elif isinstance(event, se.ResponseListen):
                key = listen_key(event)
                yield ResponseHandle(self, self._demux.responses[key])

    async def wait_for(self, *types: str, timeout_s: float | None = None) -> Any:
        """The next event of one of ``types`` (errors from the server raise)."""
        return await self._waiter(types)(None, timeout_s or self.timeout_s)


def _tag(event: Any) -> str | None:
    config = getattr(event, "__struct_config__", None)
    return getattr(config, "tag", None) if config else None


def _protocol_error(body: Any) -> DuplexProtocolError:
    return DuplexProtocolError(body.code, body.message, body.event_id, body.type, body.param)


DuplexClientErrorTypes = (DuplexProtocolError, DuplexConnectionError, DuplexSessionClosedError)
