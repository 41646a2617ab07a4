"""Attacks on a running server, one per finding of the security review
(issue 16), shared by the abuse tests and ``duplex-server bench abuse``.

Each attack comes from its own client address (``Target.source``: another
loopback address, so the per-address caps it meets are its own, not the
bystanders'), repeats until ``stop`` is set, and returns an
:class:`AttackReport`: how many attempts it made, how the server refused
them (by error code, close code or HTTP status), and every answer that broke
the bound the server promises (``violations``). The bound held when the
attack made attempts, the server refused them the documented way, and
nothing broke it. What the attack did to *other* sessions is measured by
its caller (a bystander's heartbeats), not here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection, connect

ANSWER_TIMEOUT_S = 30.0  # a server that does not answer at all is a violation, not a hang
MAX_KEPT_VIOLATIONS = 20
PCM_100MS = base64.b64encode(b"\x10\x00" * 2400).decode()  # 100 ms of 24 kHz pcm16

# Values the review found accepted; each must now be refused with its code.
ABSURD_SETTINGS: list[tuple[dict[str, Any], str]] = [
    ({"output_sample_rate_hz": 2_400_000_000}, "invalid_audio"),
    ({"input_sample_rate_hz": 2_400_000_000}, "invalid_audio"),
    (
        {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 2_400_000_000}}}},
        "invalid_audio",
    ),
    ({"idle_timeout_s": 1e300}, "invalid_event"),
]
DEEP_FRAME = '{"type":"session.update","session":{"metadata":{"k":' + "[" * 975 + "]" * 975 + "}}}"
OVERSIZED_FRAME_BYTES = 16 * 1024 * 1024 - 4096  # what the review sent: under the old 16 MiB limit


@dataclass(frozen=True)
class Target:
    """Where to attack from and what the server was started with (the bounds
    the attacks check against)."""

    host: str
    port: int
    source: str = "127.0.0.2"
    ws_path: str = "/v1/realtime?duplex=1"
    max_connections_per_ip: int = 256
    max_sessions_per_ip: int = 256
    max_input_realtime_factor: float = 2.0
    input_burst_ms: float = 10_000.0

    def ws_url(self, query: str = "") -> str:
        return f"ws://{self.host}:{self.port}{self.ws_path}" + (f"&{query}" if query else "")

    def connect(self, query: str = "") -> connect:
        return connect(
            self.ws_url(query),
            local_addr=(self.source, 0),
            max_size=None,
            ping_interval=None,
            open_timeout=ANSWER_TIMEOUT_S,
        )

    async def open_tcp(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port, local_addr=(self.source, 0))


@dataclass
class AttackReport:
    attack: str
    attempts: int = 0
    refusals: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def refused(self, how: str) -> None:
        self.refusals[how] += 1

    def broke(self, what: str) -> None:
        if len(self.violations) < MAX_KEPT_VIOLATIONS:
            self.violations.append(what)

    @property
    def held(self) -> bool:
        return self.attempts > 0 and bool(self.refusals) and not self.violations

    def as_json(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "refusals": dict(self.refusals),
            "violations": self.violations,
            "bound_held": self.held,
            **self.facts,
        }


Attack = Callable[[Target, asyncio.Event], Coroutine[Any, Any, AttackReport]]


async def _event(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), ANSWER_TIMEOUT_S))


async def _opened(ws: ClientConnection) -> dict[str, Any]:
    """The first event of an autostarted socket: ``session.created`` or an error."""
    return await _event(ws)


async def _verdict(ws: ClientConnection, event_id: str) -> str:
    """How the server took the event just sent as ``event_id``: its error
    code, or ``accepted``. A heartbeat follows the event; the server answers
    in order, so its ack closes the window in which a refusal could come."""
    await ws.send(json.dumps({"type": "session.heartbeat"}))
    verdict = "accepted"
    while (event := await _event(ws))["type"] != "session.heartbeat_ack":
        if event["type"] == "error" and event["error"].get("event_id") in (event_id, None):
            verdict = str(event["error"]["code"])  # a frame that did not parse names no event
    return verdict


# How a server refuses a connection before reading it: a close, or a reset.
CONNECTION_REFUSED = (websockets.InvalidHandshake, websockets.ConnectionClosed, OSError)
RECONNECT_PAUSE_S = 0.01


async def _connect(
    target: Target, report: AttackReport, query: str = ""
) -> ClientConnection | None:
    """A new socket, or None when the server closed the connection unread
    (counted as a refusal; a connect that hangs is not one, and raises)."""
    try:
        return await target.connect(query)
    except TimeoutError:
        raise
    except CONNECTION_REFUSED:
        report.refused("connection closed")
        await asyncio.sleep(RECONNECT_PAUSE_S)
        return None


async def _close_code(ws: ClientConnection) -> int | None:
    """Read until the server closes; its close code."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), ANSWER_TIMEOUT_S)
    except websockets.ConnectionClosed as closed:
        return None if closed.rcvd is None else closed.rcvd.code


async def absurd_settings(target: Target, stop: asyncio.Event) -> AttackReport:
    """Sample rates of 2.4 GHz (one 4.8 KB append at that rate once froze
    every session for 34 s) and an idle timeout of 1e300 s: each refused with
    its code, the session still serving legitimate audio."""
    report = AttackReport("absurd_settings")
    async with target.connect() as ws:
        await _opened(ws)
        while not stop.is_set():
            for patch, code in ABSURD_SETTINGS:
                event_id = f"x{report.attempts}"
                report.attempts += 1
                update = {"type": "session.update", "session": patch, "event_id": event_id}
                await ws.send(json.dumps(update))
                verdict = await _verdict(ws, event_id)
                if verdict == code:
                    report.refused(code)
                else:
                    report.broke(f"{sorted(patch)} answered {verdict}, not {code}")
            event_id = f"a{report.attempts}"
            append = {"type": "input_audio_buffer.append", "audio": PCM_100MS, "event_id": event_id}
            await ws.send(json.dumps(append))
            if (verdict := await _verdict(ws, event_id)) not in ("accepted", "rate_limited"):
                report.broke(f"a legitimate append answered {verdict}")
    return report


async def append_flood(target: Target, stop: asyncio.Event) -> AttackReport:
    """100 ms appends as fast as the socket takes them (the review got
    10,000 in 0.26 s accepted): past the burst they are refused
    (``rate_limited``), and what is admitted stays within the budget."""
    report = AttackReport("append_flood")
    refused: set[str] = set()
    async with target.connect() as ws:
        created = await _opened(ws)
        reader = asyncio.create_task(_collect_refusals(ws, report, refused))
        started = time.monotonic()
        while not stop.is_set():
            event_id = f"f{report.attempts}"
            report.attempts += 1
            frame = {"type": "input_audio_buffer.append", "audio": PCM_100MS, "event_id": event_id}
            await ws.send(json.dumps(frame))
            await asyncio.sleep(0)  # a flood, but not one that starves this process's other work
        await ws.send(json.dumps({"type": "session.heartbeat", "event_id": "last"}))
        await asyncio.wait_for(reader, ANSWER_TIMEOUT_S)
        # Until the server read the last append: it drains a throttled flood
        # after the sending stops, earning budget meanwhile.
        elapsed_s = time.monotonic() - started
        await _close_session(ws)
        report.facts["session_id"] = created["session"]["id"]
    admitted_ms = (report.attempts - len(refused)) * 100.0
    # The session's bucket started filling when it opened, a little before the flood.
    allowed_ms = target.max_input_realtime_factor * (elapsed_s + 1.0) * 1000 + target.input_burst_ms
    report.facts.update(admitted_audio_ms=admitted_ms, allowed_audio_ms=round(allowed_ms))
    if admitted_ms > allowed_ms:
        report.broke(f"admitted {admitted_ms:.0f} ms of audio, the budget is {allowed_ms:.0f} ms")
    return report


async def _close_session(ws: ClientConnection) -> None:
    """Close the attacker's session, as a client that is done would."""
    await ws.send(json.dumps({"type": "session.close"}))
    while (await _event(ws))["type"] != "session.closed":
        pass


async def _collect_refusals(ws: ClientConnection, report: AttackReport, refused: set[str]) -> None:
    """Count the flood's refusals until the closing heartbeat is answered."""
    while True:
        event = await _event(ws)
        if event["type"] == "session.heartbeat_ack":
            return
        if event["type"] == "error":
            error = event["error"]
            if error["code"] == "rate_limited" and error.get("event_id"):
                refused.add(error["event_id"])
                report.refused("rate_limited")
            elif error["code"] != "rate_limited":
                report.broke(f"a flooded append answered {error['code']}")


async def video_flood(target: Target, stop: asyncio.Event) -> AttackReport:
    """Appends carrying nine video frames, or one of 1.1 MiB (the review
    added ~345 MB with 100 appends of ~3 MiB of frames): each refused."""
    from duplex_server.surface import MAX_VIDEO_FRAME_BYTES, MAX_VIDEO_FRAMES

    many = [base64.b64encode(b"\xff\xd8\xff").decode()] * (MAX_VIDEO_FRAMES + 1)
    large = [base64.b64encode(b"\xff\xd8" + b"\x00" * (MAX_VIDEO_FRAME_BYTES + 1024)).decode()]
    report = AttackReport("video_flood")
    async with target.connect() as ws:
        await _opened(ws)
        while not stop.is_set():
            for frames in (many, large):
                event_id = f"v{report.attempts}"
                report.attempts += 1
                append = {
                    "type": "input_audio_buffer.append",
                    "audio": PCM_100MS,
                    "video_frames": frames,
                    "event_id": event_id,
                }
                await ws.send(json.dumps(append))
                verdict = await _verdict(ws, event_id)
                if verdict in ("invalid_event", "payload_too_large"):
                    report.refused(verdict)
                else:
                    report.broke(f"an append with {len(frames)} oversized video frames: {verdict}")
    return report


async def session_grab(target: Target, stop: asyncio.Event) -> AttackReport:
    """Sessions opened from one address as fast as it can (the review took
    all 1,000 slots in 2 s): past the address's cap each is refused, and the
    sessions it did get are closed when it stops."""
    report = AttackReport("session_grab")
    cap = min(target.max_sessions_per_ip, target.max_connections_per_ip)
    async with contextlib.AsyncExitStack() as held:
        sessions: list[ClientConnection] = []
        while not stop.is_set():
            report.attempts += 1
            try:
                ws = await held.enter_async_context(target.connect())
            except websockets.InvalidStatus as refused:
                report.refused(_refusal_code(refused))
                await asyncio.sleep(RECONNECT_PAUSE_S)
                continue
            except TimeoutError:
                raise
            except CONNECTION_REFUSED:
                report.refused("connection closed")
                await asyncio.sleep(RECONNECT_PAUSE_S)
                continue
            opened = await _opened(ws)
            if opened["type"] == "session.created":
                sessions.append(ws)
            elif opened["type"] == "error":
                report.refused(opened["error"]["code"])
                await ws.close()
                await asyncio.sleep(RECONNECT_PAUSE_S)
        report.facts["sessions_held"] = len(sessions)
        if len(sessions) > cap:
            report.broke(f"one address opened {len(sessions)} sessions, the cap is {cap}")
        for ws in sessions:  # free the slots for whoever comes next from this address
            await ws.send(json.dumps({"type": "session.close"}))
    return report


def _refusal_code(refused: websockets.InvalidStatus) -> str:
    """The error code of an upgrade answered with an HTTP refusal in
    OpenAI's shape (``resource_exhausted`` past a quota), else its status."""
    try:
        return str(json.loads(refused.response.body or b"")["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return f"http {refused.response.status_code}"


async def silent_sockets(target: Target, stop: asyncio.Event) -> AttackReport:
    """TCP connections that never send a byte (2,000 were never closed, and
    600 locked out every client of a server with 512 descriptors)."""
    return await _idle_connections("silent_sockets", target, stop, b"")


async def half_sent_requests(target: Target, stop: asyncio.Event) -> AttackReport:
    """HTTP requests whose head never ends, a header line trickled now and
    then to keep the socket warm (300 were never closed)."""
    return await _idle_connections(
        "half_sent_requests", target, stop, b"GET /health HTTP/1.1\r\nHost: x\r\n"
    )


async def _open_tcp(
    target: Target, report: AttackReport
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A TCP connection from the attack's address, or None (the refusal counted)."""
    try:
        return await target.open_tcp()
    except OSError as exc:
        report.refused(f"connect {exc.errno}")
        return None


async def _idle_connections(
    name: str, target: Target, stop: asyncio.Event, opening: bytes, count: int = 1000
) -> AttackReport:
    """Open ``count`` connections that send ``opening`` and then (slowly)
    never finish: beyond the address's cap they are closed at once, the rest
    at the header deadline; at no time does the address hold more than its cap."""
    report = AttackReport(name)
    sockets: list[tuple[asyncio.StreamWriter, asyncio.Task[bytes]]] = []
    try:
        while len(sockets) < count and not stop.is_set():
            report.attempts += 1
            if (opened := await _open_tcp(target, report)) is None:
                continue
            reader, writer = opened
            if opening:
                writer.write(opening)
            sockets.append((writer, asyncio.create_task(reader.read(1))))
            await asyncio.sleep(0)
        while not stop.is_set():
            for writer, closed in sockets:
                if opening and not closed.done() and not writer.is_closing():
                    writer.write(b"X-Slow: 1\r\n")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        still_open = sum(not closed.done() for _, closed in sockets)
        report.facts.update(opened=len(sockets), open_at_stop=still_open)
        for _, closed in sockets:
            if closed.done():
                report.refused("closed by the server")
        if still_open > target.max_connections_per_ip:
            report.broke(
                f"{still_open} idle connections from one address still open, "
                f"the cap is {target.max_connections_per_ip}"
            )
    finally:
        for writer, closed in sockets:
            closed.cancel()
            writer.close()
    return report


UPGRADE = (
    b"GET /v1/realtime?autostart=0 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)
HEAD_LIMIT = 16_384


async def connection_flood(target: Target, stop: asyncio.Event) -> AttackReport:
    """WebSocket upgrades opened as fast as one address can (no session: the
    flood is of connections): past the address's connection rate each must
    be answered ``429`` with ``Retry-After``, never closed without a byte
    (clients then say "did not receive a valid HTTP response" and cannot
    tell when to come back). Upgrades inside the rate get ``101``."""
    report = AttackReport("connection_flood")
    started = time.monotonic()
    while not stop.is_set():
        report.attempts += 1
        if (opened := await _open_tcp(target, report)) is None:
            continue
        reader, writer = opened
        try:
            writer.write(UPGRADE)
            head = await asyncio.wait_for(_response_head(reader), ANSWER_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError):
            head = b""
        finally:
            writer.close()
        _judge_answer(report, head)
    elapsed = time.monotonic() - started
    report.facts["attempts_per_s"] = round(report.attempts / elapsed, 1) if elapsed else 0.0
    return report


async def _response_head(reader: asyncio.StreamReader) -> bytes:
    """The status line and headers of the server's answer (empty: closed first)."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as cut:
        return cut.partial
    except asyncio.LimitOverrunError:
        return await reader.read(HEAD_LIMIT)


def _judge_answer(report: AttackReport, head: bytes) -> None:
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ")[1] if lines[0].startswith("HTTP/1.1 ") else ""
    headers = {line.split(":", 1)[0].strip().lower() for line in lines[1:] if ":" in line}
    if status == "101":
        report.facts["upgraded"] = report.facts.get("upgraded", 0) + 1
    elif status == "429" and "retry-after" in headers:
        report.refused("http 429")
    elif not head:
        report.broke("an upgrade was closed without an answer")
    else:
        report.broke(f"an upgrade was answered {lines[0]!r} without Retry-After")


async def deep_nesting(target: Target, stop: asyncio.Event) -> AttackReport:
    """A 5.9 KB frame nested 975 deep (it once raised an uncaught
    RecursionError and dropped the socket): ``invalid_json``, socket kept."""
    report = AttackReport("deep_nesting")
    async with target.connect() as ws:
        await _opened(ws)
        while not stop.is_set():
            report.attempts += 1
            await ws.send(DEEP_FRAME)
            try:
                verdict = await _verdict(ws, f"d{report.attempts}")
            except websockets.ConnectionClosed as closed:
                report.broke(f"the socket was closed ({closed.rcvd}) by a deep frame")
                break
            if verdict == "invalid_json":
                report.refused(verdict)
            else:
                report.broke(f"a frame nested 975 deep answered {verdict}")
    return report


async def oversized_frames(target: Target, stop: asyncio.Event) -> AttackReport:
    """Frames of almost 16 MiB (each was buffered whole before the 4 MiB app
    limit refused it): the WebSocket layer closes the socket (1009) first."""
    report = AttackReport("oversized_frames")
    frame = "A" * OVERSIZED_FRAME_BYTES
    while not stop.is_set():
        report.attempts += 1
        if (ws := await _connect(target, report, "autostart=0")) is None:
            continue
        async with ws:
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.send(frame)
            code = await _close_code(ws)
        if code == 1009:
            report.refused("close 1009")
        else:
            report.broke(f"a {OVERSIZED_FRAME_BYTES}-byte frame got close code {code}")
    return report


async def resume_guessing(target: Target, stop: asyncio.Event) -> AttackReport:
    """Guessed resume tokens for a live session: each refused
    (``invalid_resume_token``), the fifth failure on a socket closes it (1008)."""
    report = AttackReport("resume_guessing")
    async with target.connect() as owner:
        created = await _opened(owner)
        session_id = created["session"]["id"]
        while not stop.is_set():
            if (ws := await _connect(target, report, "autostart=0")) is not None:
                async with ws:
                    await _guess_five(ws, session_id, report)
        await owner.send(json.dumps({"type": "session.close"}))
    return report


async def _guess_five(ws: ClientConnection, session_id: str, report: AttackReport) -> None:
    for guess in range(5):
        report.attempts += 1
        resume = {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": f"guess-{report.attempts:020d}",
            "last_received_server_event_seq": 0,
            "event_id": f"g{report.attempts}",
        }
        await ws.send(json.dumps(resume))
        answer = await _event(ws)
        code = answer["error"]["code"] if answer["type"] == "error" else answer["type"]
        if code == "invalid_resume_token":
            report.refused(code)
        else:
            report.broke(f"guess {guess} answered {code}")
    closed = await _close_code(ws)
    if closed == 1008:
        report.refused("close 1008")
    else:
        report.broke(f"five failed resumes left the socket open ({closed})")


ATTACKS: dict[str, Attack] = {
    "absurd_settings": absurd_settings,
    "append_flood": append_flood,
    "video_flood": video_flood,
    "session_grab": session_grab,
    "silent_sockets": silent_sockets,
    "half_sent_requests": half_sent_requests,
    "deep_nesting": deep_nesting,
    "oversized_frames": oversized_frames,
    "resume_guessing": resume_guessing,
    "connection_flood": connection_flood,
}


@contextlib.asynccontextmanager
async def running(attack: Attack, target: Target) -> AsyncIterator[asyncio.Task[AttackReport]]:
    """Run ``attack`` while the body runs; stop it when the body ends."""
    stop = asyncio.Event()
    task = asyncio.create_task(attack(target, stop))
    try:
        yield task
    finally:
        stop.set()
        if not task.done():
            await asyncio.wait({task}, timeout=ANSWER_TIMEOUT_S * 2)
