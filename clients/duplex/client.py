"""``DuplexClient``: the asyncio shell around :class:`Demux`.

One reader task owns the socket's receive side: it feeds frames to the demux,
queues typed events for ``events()``, resolves waiters, acks the journal, and
on a transport drop reconnects and resumes the session (jittered exponential
backoff), so callers see one continuous stream plus a ``ConnectionResumed``.
Everything it sends is a ``protocol.client_events`` struct, the very type the
server decodes, so a field the server does not know cannot be sent by mistake.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgspec
import websockets

from clients.duplex.audio import AudioFormat, session_formats
from clients.duplex.demux import ConnectionResumed, Demux, ResponseView, listen_key
from clients.duplex.errors import (
    DuplexConnectionError,
    DuplexProtocolError,
    DuplexSessionClosedError,
)
from clients.duplex.trace import DuplexTrace
from clients.duplex.transport import TRANSPORT_CLOSED, Connect, Transport, websocket
from protocol import client_events as ce
from protocol import server_events as se
from protocol.audio_frames import FORMAT_CODES, AudioFrame, FrameKind, as_append, pack
from protocol.close_codes import CloseCode
from protocol.session_config import SessionUpdate

SessionConfig = SessionUpdate
DEFAULT_TIMEOUT_S = 10.0
# A video frame rides the append that closes its whole second of audio, as
# vLLM-Omni pairs them (a second of audio and the picture taken during it).
VIDEO_UNIT_MS = 1000
_END = object()
_JSON = msgspec.json.Encoder()
# The upgrade's answer header by which the server confirms ``?audio=binary``.
AUDIO_CONFIRM_HEADER = "x-duplex-audio"


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
    def output_format(self) -> AudioFormat:
        """``audio_bytes``' format: ``duration_ms(len(audio_bytes))`` is how long it plays."""
        return AudioFormat(self._view.audio_format, self._view.sample_rate_hz)

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
        connect: Connect | None = None,
        binary_audio: bool | None = None,
    ) -> None:
        """``replicas``: other servers of the same deployment (one Redis); a
        dropped connection is resumed on them in turn when ``url`` is gone.
        ``connect``: opens the transport for a URL (the first connection and
        every resume); by default a websocket carrying ``api_key``.
        ``binary_audio``: audio as WebSocket binary frames (``?audio=binary``).
        None (the default): asked for on a duplex-wire URL (``/v1/duplex``,
        ``duplex=1``) and used where the server confirms it, else JSON; True:
        asked for everywhere and required (a server that does not confirm
        it is a ``DuplexConnectionError``); False: never."""
        self.url = url
        self.replicas = list(replicas)
        self.config = config or SessionConfig()
        if model is not None:
            self.config = msgspec.structs.replace(self.config, model=model)
        self.reconnect = reconnect
        self.heartbeat_interval_s = heartbeat_interval_s
        self.api_key = api_key
        self._open = connect or websocket(api_key)
        self.binary_audio = binary_audio
        self._binary_ws: Transport | None = None  # the socket, when it carries binary audio
        self.timeout_s = timeout_s
        self.trace = trace
        self.ack_every = ack_every
        self.session_id: str | None = None
        self.session: se.SessionObject | None = None
        self.resume_token: str | None = None
        self.closed_reason: str | None = None
        self._demux = Demux()
        self._ws: Transport | None = None
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
        self._appended_ms = 0.0  # the input timeline: audio_end_ms of the last append
        self._failure: BaseException | None = None
        self._shut = False

    @property
    def input_format(self) -> AudioFormat:
        """What the server reads appended audio as (``append_audio`` stamps it)."""
        return session_formats(self.session)[0]

    @property
    def output_format(self) -> AudioFormat:
        """What the server's audio deltas carry."""
        return session_formats(self.session)[1]

    # --- lifecycle -----------------------------------------------------------

    @property
    def uses_binary_audio(self) -> bool:
        """Whether the current socket carries audio in binary frames."""
        return self._ws is not None and self._ws is self._binary_ws

    async def __aenter__(self) -> DuplexClient:
        self._ws = await self._connect()
        self._demux.use_binary_audio(self._ws is self._binary_ws)
        try:
            await self._send_now(ce.SessionUpdateEvent(session=self.config))
            created = await self._handshake(self._ws, se.SessionCreated)
        except BaseException:
            await self._shutdown()  # no session: nothing to close but the transport
            raise
        self.session_id = created.session.id if created.session else None
        self.session = created.session
        self.resume_token = created.resume_token
        self._deliver(created)
        self._reader = asyncio.create_task(self._read_forever())
        if self.heartbeat_interval_s:
            self._heartbeat = asyncio.create_task(self._beat())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self, timeout_s: float | None = None) -> None:
        """End the session (``session.close``, then ``session.closed``) and the
        transport. Idempotent; a session the server already ended is not closed
        again, and a server that does not confirm within ``timeout_s`` (default
        the client's) is left to notice the socket closing."""
        if self._shut:
            return
        try:
            if self.closed_reason is None and self._ws is not None:
                with contextlib.suppress(*DuplexClientErrorTypes):
                    await self.send(ce.SessionClose())
                    await self.wait_for("session.closed", timeout_s=timeout_s or self.timeout_s)
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._shut = True
        for task in (self._heartbeat, self._reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._ws is not None:
            await self._ws.close()

    def _asks_binary(self, url: str) -> bool:
        if self.binary_audio is not None:
            return self.binary_audio
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        wire = parts.path.rstrip("/").endswith("/v1/duplex")
        return wire or query.get("duplex", "").lower() in ("1", "true", "on", "yes")

    async def _connect(self, url: str | None = None) -> Transport:
        url = url or self.url
        binary = self._asks_binary(url)
        params = {"autostart": "0", **({"audio": "binary"} if binary else {})}
        try:
            opening = self._open(_with_query(url, **params))
            ws = await asyncio.wait_for(opening, self.timeout_s)
        except (TimeoutError, OSError, websockets.WebSocketException) as exc:
            raise DuplexConnectionError(f"cannot connect to {url}: {exc}") from exc
        if binary and _confirms_binary(ws):
            self._binary_ws = ws
        elif binary and self.binary_audio:
            await ws.close()
            raise DuplexConnectionError(f"{url} did not confirm binary audio (audio=binary)")
        return ws

    async def _handshake(self, ws: Transport, expected: type[msgspec.Struct]) -> Any:
        """Read until ``expected`` (session.created / session.resumed) or an error."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                frame = await asyncio.wait_for(ws.recv(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise DuplexConnectionError(
                    f"no {expected.__struct_config__.tag} within {self.timeout_s} s"
                ) from None
            except TRANSPORT_CLOSED as exc:
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
                except TRANSPORT_CLOSED as exc:
                    if self.closed_reason is not None:
                        break
                    if _close_code(exc) == CloseCode.REPLACED:
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
        elif isinstance(event, se.SessionUpdated) and event.session is not None:
            self.session = event.session
        self._events.put_nowait(event)
        for listener in list(self._listeners):
            listener(event)
        self._wake()

    async def _maybe_ack(self) -> None:
        if self._demux.last_seq - self._acked >= self.ack_every:
            self._acked = self._demux.last_seq
            await self._send_now(ce.SessionEventAck(server_event_seq=self._acked))

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
            self._demux.use_binary_audio(ws is self._binary_ws)
            self._demux.expect_replay(self._demux.last_seq)
            resume = ce.SessionResume(
                session_id=self.session_id or "",
                resume_token=self.resume_token or "",
                last_received_server_event_seq=self._demux.last_seq,
            )
            try:
                await self._send_on(ws, resume)
                resumed = await self._handshake(ws, se.SessionResumed)
            except DuplexProtocolError as exc:
                await ws.close()
                raise DuplexSessionClosedError(f"resume refused: {exc.code}") from exc
            except (DuplexConnectionError, *TRANSPORT_CLOSED):
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
                await self._send_now(ce.SessionHeartbeat())

    # --- sending -------------------------------------------------------------

    def _trace(self, direction: str, frame: str | bytes) -> None:
        if self.trace is not None:
            self.trace.record(direction, frame)

    async def _send_on(self, ws: Transport, event: ce.ClientEvent | dict[str, Any]) -> None:
        frame = _JSON.encode(event).decode()  # a text frame, as the protocol has them
        self._trace("out", frame)
        await ws.send(frame)

    async def _send_now(
        self, event: ce.ClientEvent | dict[str, Any], event_id: str | None = None
    ) -> None:
        ws = self._connection()
        try:
            await self._send_on(ws, event)
        except TRANSPORT_CLOSED as exc:
            if self.reconnect is None:
                raise DuplexSessionClosedError(f"transport dropped ({exc})") from exc
            # The reader is resuming; a retry with the same event_id is applied
            # once (if the first send landed, the server says duplicate_event).
            await self._await_reconnect(ws)
            if event_id is not None:
                self._retried.add(event_id)
            await self._send_on(self._connection(), event)

    def _connection(self) -> Transport:
        """The socket; a DuplexConnectionError before connect() made one."""
        if self._ws is None:
            raise DuplexConnectionError("not connected: use `async with DuplexClient(...)`")
        return self._ws

    async def _await_reconnect(self, dropped: Transport) -> None:
        """Until the reader has resumed the session on a transport other than ``dropped``."""
        deadline = time.monotonic() + self.timeout_s
        while self._ws is dropped:
            await self._changed(max(0.0, deadline - time.monotonic()))

    async def send(self, event: ce.ClientEvent | dict[str, Any]) -> str:
        """Send a client event, stamped with an ``event_id`` unless it has one;
        returns that id. A dict is the escape hatch for an event
        ``protocol.client_events`` does not model (it is sent as it is)."""
        if self._failure is not None:
            raise self._failure
        fresh = f"c_{self._prefix}_{next(self._ids)}"
        if isinstance(event, dict):
            event = {"event_id": fresh, **event}
            event_id = str(event["event_id"])
        else:
            if event.event_id is None:
                event = msgspec.structs.replace(event, event_id=fresh)
            event_id = str(event.event_id)
        await self._send_now(event, event_id)
        return event_id

    async def _call(self, event: ce.ClientEvent, *done: str, timeout_s: float | None = None) -> Any:
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

    async def append_audio(
        self,
        pcm: bytes,
        *,
        audio_format: AudioFormat | None = None,
        is_speech: bool | None = None,
        video_frames: Sequence[str] = (),
    ) -> str:
        """Append ``pcm`` (in ``audio_format``, by default the session's input
        format), stamped with its format and rate and, where bytes tell time,
        its ``duration_ms`` and the input timeline's ``audio_end_ms`` (the
        session's total, never reset). ``video_frames``: base64 JPEG/PNG
        (data URLs are sent as bare base64)."""
        fmt = audio_format or self.input_format
        duration_ms = end_ms = None
        if fmt.timed_by_size:
            duration_ms = fmt.duration_ms(len(pcm))
            self._appended_ms += duration_ms
            end_ms = self._appended_ms
        if self.uses_binary_audio and not video_frames and fmt.encoding in FORMAT_CODES:
            # The binary frame is the append without audio_end_ms: the server
            # derives the same timeline, the sum of the durations before it.
            frame = AudioFrame(
                kind=FrameKind.INPUT_APPEND,
                format=fmt.encoding,
                sequence=next(self._ids),
                payload=pcm,
                sample_rate_hz=fmt.sample_rate_hz,
                duration_us=round(duration_ms * 1000) if duration_ms else 0,
                is_speech=is_speech,
            )
            return await self._send_audio(frame)
        event = ce.InputAudioAppend(
            audio=base64.b64encode(pcm).decode(),
            format=fmt.encoding,
            sample_rate_hz=fmt.sample_rate_hz,
            duration_ms=duration_ms,
            audio_end_ms=end_ms,
            is_speech=is_speech,
            video_frames=[_bare_base64(frame) for frame in video_frames],
        )
        return await self.send(event)

    async def _send_audio(self, frame: AudioFrame) -> str:
        """Send an input frame; after a drop, again on the resumed socket (as
        the same append in JSON where that one carries no binary audio: the
        server sees one event either way, and a retry of it is a retry)."""
        if self._failure is not None:
            raise self._failure
        event = as_append(frame)
        event_id = str(event.event_id)
        ws = self._connection()
        try:
            await self._send_frame(ws, frame)
        except TRANSPORT_CLOSED as exc:
            if self.reconnect is None:
                raise DuplexSessionClosedError(f"transport dropped ({exc})") from exc
            await self._await_reconnect(ws)
            self._retried.add(event_id)
            ws = self._connection()
            if ws is self._binary_ws:
                await self._send_frame(ws, frame)
            else:
                await self._send_on(ws, event)
        return event_id

    async def _send_frame(self, ws: Transport, frame: AudioFrame) -> None:
        data = pack(frame)
        self._trace("out", data)
        await ws.send(data)

    async def stream_pcm(
        self,
        pcm: bytes,
        chunk_ms: int = 100,
        realtime: bool = True,
        sample_rate_hz: int | None = None,
        *,
        video_frames: Sequence[str] = (),
        is_speech: bool | None = None,
    ) -> None:
        """Append ``pcm`` in ``chunk_ms`` pieces, paced like a microphone if
        ``realtime``. It is in the session's input format, at ``sample_rate_hz``
        when given. ``video_frames``: one per second of audio, in capture
        order; frame k rides the append that completes second k+1, and the
        last one repeats while the audio outlasts them (a still image is one)."""
        fmt = self.input_format
        if sample_rate_hz is not None:
            fmt = AudioFormat(fmt.encoding, sample_rate_hz)
        step = max(fmt.byte_count(chunk_ms), fmt.bytes_per_sample)
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        streamed_ms, frames_sent = 0.0, 0
        for offset in range(0, len(pcm), step):
            chunk = pcm[offset : offset + step]
            streamed_ms += fmt.duration_ms(len(chunk))
            unit: list[str] = []
            if video_frames and streamed_ms >= VIDEO_UNIT_MS * (frames_sent + 1):
                unit = [video_frames[min(frames_sent, len(video_frames) - 1)]]
                frames_sent += 1
            await self.append_audio(chunk, audio_format=fmt, is_speech=is_speech, video_frames=unit)
            if realtime:
                next_at += fmt.duration_ms(len(chunk)) / 1000
                await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def commit(
        self, create_response: bool | None = None, *, final: bool | None = None
    ) -> se.InputCommitted:
        event = ce.InputAudioCommit(final=final, response_create=create_response)
        return await self._call(event, "input_audio_buffer.committed", "response.listen")

    async def create_response(self, **overrides: Any) -> se.ResponseCreated:
        """``overrides``: the fields of ``response.create``'s ``response``
        (``protocol.client_events.ResponseOverrides``), checked before sending."""
        response = msgspec.convert(overrides, ce.ResponseOverrides) if overrides else None
        return await self._call(ce.ResponseCreate(response=response), "response.created")

    async def cancel_response(self, response_id: str | None = None) -> se.ResponseDone:
        event = ce.ResponseCancel(response_id=response_id or None)
        return await self._call(event, "response.done")

    async def clear_input(self) -> se.InputCleared:
        return await self._call(ce.InputAudioClear(), "input_audio_buffer.cleared")

    async def barge_in(self) -> se.OutputAudioCleared:
        return await self._call(ce.BargeIn(), "output_audio_buffer.cleared")

    async def ack_playback(
        self,
        played_ms: float,
        response_id: str | None = None,
        *,
        committed_ms: float | None = None,
        item_id: str | None = None,
        truncate: bool = False,
    ) -> se.PlaybackAcknowledged:
        """Report cumulative playback: ``played_ms`` heard so far,
        ``committed_ms`` of it to keep in history (the server's choice when
        None), ``truncate`` to cut the answer where playback stopped."""
        event = ce.PlaybackAck(
            played_ms=played_ms,
            committed_ms=committed_ms,
            truncate=truncate,
            response_id=response_id or None,
            item_id=item_id,
        )
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


def _confirms_binary(ws: Transport) -> bool:
    """Whether the upgrade's answer confirmed ``?audio=binary`` (a transport
    that does not show it, like an older server, did not)."""
    response = getattr(ws, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return False
    return str(headers.get(AUDIO_CONFIRM_HEADER, "")).lower() == "binary"


def _close_code(exc: BaseException) -> int | None:
    """The close code the peer sent, where the transport says (websockets does)."""
    if isinstance(exc, websockets.ConnectionClosed) and exc.rcvd is not None:
        return exc.rcvd.code
    return None


def _bare_base64(data: str) -> str:
    """A ``data:<mime>;base64,`` URL's payload: the wire carries bare base64."""
    if data.startswith("data:"):
        _, _, payload = data.partition(";base64,")
        return payload or data
    return data


def _tag(event: Any) -> str | None:
    config = getattr(event, "__struct_config__", None)
    return getattr(config, "tag", None) if config else None


def _protocol_error(body: Any) -> DuplexProtocolError:
    return DuplexProtocolError(body.code, body.message, body.event_id, body.type, body.param)


DuplexClientErrorTypes = (DuplexProtocolError, DuplexConnectionError, DuplexSessionClosedError)
