"""The abuse suite: every finding of the security review (issue 16) replayed
against a real server process while a well-behaved session, beside it,
keeps talking.

Each test runs one attack from ``duplex_bench.attacks`` (the same
code ``duplex-server bench abuse`` runs at load) from its own loopback
address, and asserts two things: the bound held (the server refused the
attack the documented way and nothing got past it), and the bystander's
heartbeats were answered in every third of the attack, after which its
session still answers a spoken turn. How fast the bystander is answered is
a speed target, so it lives in the benchmark (p99 within 2x of a quiet
run), not here: a test on a shared machine asserts progress, not a clock.

Findings covered elsewhere, because they are not attacks on a running
server: ``--api-key ""`` and secrets in the server's own log
(tests/e2e/test_secrets.py), ``inspect``'s escapes and paths
(tests/e2e/test_audit_cli.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
import websockets

from duplex_bench import attacks
from duplex_bench.attacks import AttackReport, Target
from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_keys import bearer, keys_file
from tests.wsclient import WsClient, tone_pcm16

ATTACK_S = 3.0
WINDOWS = 3  # the bystander must be answered in each third of the attack
CAPS = {
    "max_connections_per_ip": 32,
    "max_connection_rate_per_ip": 20.0,
    "max_sessions_per_ip": 8,
    "header_timeout_s": 1.0,
    "input_burst_ms": 1000.0,
}
_sources = (f"127.0.0.{n}" for n in itertools.count(2))


@pytest.fixture(scope="module")
def abused():
    """One server for the module; each attack comes from an address of its own."""
    server = ServerProcess("memory", **CAPS).start()
    try:
        yield server
    finally:
        server.stop()


def target_of(server: ServerProcess) -> Target:
    return Target(
        "127.0.0.1",
        server.port,
        source=next(_sources),
        max_connections_per_ip=int(server.flags["max_connections_per_ip"] or 0) or 256,
        max_sessions_per_ip=int(server.flags["max_sessions_per_ip"] or 0) or 256,
        input_burst_ms=float(server.flags.get("input_burst_ms") or 10_000.0),
    )


class Bystander:
    """A well-behaved session: heartbeats back to back, each answer's time kept."""

    def __init__(self, client: WsClient) -> None:
        self.client = client
        self.answered: list[float] = []

    @classmethod
    async def open(cls, server: ServerProcess, **connect) -> Bystander:
        client = await WsClient.connect(server.ws_url, **connect)
        await client.expect("session.created")
        return cls(client)

    async def beat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.client.send({"type": "session.heartbeat"})
            await self.client.recv_until("session.heartbeat_ack")
            self.answered.append(time.monotonic())

    def silent_windows(self, start: float, end: float) -> list[int]:
        """The thirds of [start, end) in which no heartbeat was answered."""
        width = (end - start) / WINDOWS
        return [
            n
            for n in range(WINDOWS)
            if not any(start + n * width <= t < start + (n + 1) * width for t in self.answered)
        ]

    async def still_converses(self) -> None:
        """A spoken turn is answered; then the session closes (its address's
        slots are the next test's)."""
        await self.client.append(tone_pcm16(300))
        await self.client.send({"type": "input_audio_buffer.commit"})
        done = (await self.client.recv_until("response.done"))[-1]
        assert done["response"]["status"] == "completed"
        await self.client.send({"type": "session.close"})
        await self.client.recv_until("session.closed")


async def under_attack(
    server: ServerProcess,
    attack: attacks.Attack,
    target: Target | None = None,
    during: Callable[[], Awaitable[None]] | None = None,
    **connect,
) -> AttackReport:
    """Run ``attack`` for ATTACK_S beside a bystander (``during`` runs halfway
    through); assert the bystander was answered throughout and still converses."""
    bystander = await Bystander.open(server, **connect)
    stop = asyncio.Event()
    beating = asyncio.create_task(bystander.beat(stop))
    start = time.monotonic()
    async with attacks.running(attack, target or target_of(server)) as attacking:
        await asyncio.sleep(ATTACK_S / 2)
        if during is not None:
            await during()
        await asyncio.sleep(max(0.0, start + ATTACK_S - time.monotonic()))
    end = time.monotonic()
    report = attacking.result()
    stop.set()
    await beating
    silent = bystander.silent_windows(start, end)
    assert not silent, (
        f"{report.attack}: the bystander's heartbeats went unanswered in thirds {silent} "
        f"of the attack ({len(bystander.answered)} answered in all)"
    )
    await bystander.still_converses()
    assert report.held, report.as_json()
    return report


async def test_absurd_rates_and_timeouts_are_refused(abused):
    report = await under_attack(abused, attacks.absurd_settings)
    assert report.refusals["invalid_audio"] and report.refusals["invalid_event"]


async def test_an_append_flood_is_held_to_the_budget_and_leaves_memory_at_close(abused):
    report = await under_attack(abused, attacks.append_flood)
    assert report.refusals["rate_limited"] > 0
    assert report.facts["admitted_audio_ms"] <= report.facts["allowed_audio_ms"]
    # the memory store let the closed flood's log go at once
    async with httpx.AsyncClient(base_url=abused.http_url) as http:
        events = await http.get(f"/v1/sessions/{report.facts['session_id']}/events")
    assert events.status_code == 404


async def test_video_frames_past_the_caps_are_refused(abused):
    report = await under_attack(abused, attacks.video_flood)
    assert report.refusals["invalid_event"] >= 2  # too many frames, and too large a frame


async def test_one_address_cannot_take_every_session_slot(abused):
    async def another_address_opens_a_session() -> None:
        newcomer = await Bystander.open(abused)
        await newcomer.still_converses()

    report = await under_attack(
        abused, attacks.session_grab, during=another_address_opens_a_session
    )
    assert report.facts["sessions_held"] == CAPS["max_sessions_per_ip"]
    assert report.refusals["resource_exhausted"] > 0


async def test_silent_connections_are_capped_per_address_and_closed_at_the_deadline(abused):
    report = await under_attack(abused, attacks.silent_sockets)
    assert report.facts["opened"] > CAPS["max_connections_per_ip"]
    assert report.facts["open_at_stop"] == 0  # the 1 s header deadline closed the rest


async def test_half_sent_requests_are_closed_at_the_header_deadline(abused):
    report = await under_attack(abused, attacks.half_sent_requests)
    assert report.facts["open_at_stop"] == 0


async def test_connections_past_the_rate_are_answered_429_with_retry_after(abused):
    report = await under_attack(abused, attacks.connection_flood)
    # Far past 20 a second from one address (2 s of burst): most are refused,
    # each with an answer a client can act on; none closed without one.
    assert report.refusals["http 429"] > CAPS["max_connection_rate_per_ip"] * 2
    assert set(report.refusals) == {"http 429"}
    assert report.facts["upgraded"] > 0  # the rate's own share still gets through


async def test_deeply_nested_frames_get_invalid_json_and_keep_the_socket(abused):
    report = await under_attack(abused, attacks.deep_nesting)
    assert report.refusals == {"invalid_json": report.attempts}


async def test_frames_past_the_limit_are_refused_before_they_are_buffered(abused):
    report = await under_attack(abused, attacks.oversized_frames)
    # Every frame that reached the server was refused with 1009; past the
    # address's connection rate a socket is closed before any frame is read.
    assert report.refusals["close 1009"] > 0
    assert set(report.refusals) <= {"close 1009", "connection closed"}
    assert sum(report.refusals.values()) == report.attempts


async def test_guessed_resume_tokens_are_refused_and_the_socket_closed(abused):
    report = await under_attack(abused, attacks.resume_guessing)
    assert report.refusals["close 1008"] * 5 == report.refusals["invalid_resume_token"]


async def test_idle_sockets_cannot_exhaust_the_descriptors(tmp_path):
    """600 idle sockets once locked every client out of a server with 512
    descriptors; the per-address cap (256) keeps room for everyone else."""
    server = ServerProcess("memory", max_connections_per_ip=256, max_open_files=512).start()
    try:

        async def a_newcomer_gets_in() -> None:
            newcomer = await Bystander.open(server)
            await newcomer.still_converses()

        target = Target("127.0.0.1", server.port, source=next(_sources), ws_path=server.ws_path)
        report = await under_attack(server, attacks.silent_sockets, target, a_newcomer_gets_in)
        assert report.facts["opened"] > 512
    finally:
        server.stop()


async def anonymous_probe(
    target: Target, stop: asyncio.Event, session_id: str, wrong_key: str
) -> AttackReport:
    """Asks for what the review found readable without the right key."""
    report = AttackReport("anonymous_probe")
    base = f"http://{target.host}:{target.port}"
    transport = httpx.AsyncHTTPTransport(local_address=target.source)
    expected = [
        ("/metrics", {}, 401),
        (f"/v1/sessions/{session_id}/events", {}, 401),
        (f"/v1/sessions/{session_id}/events", bearer(wrong_key), 403),
        (f"/v1/sessions/{session_id}", bearer(wrong_key), 403),
        (f"/v1/sessions/{session_id}/events?after={2**63}", bearer(wrong_key), 400),
    ]
    async with httpx.AsyncClient(base_url=base, transport=transport) as http:
        while not stop.is_set():
            report.attempts += 1
            health = await http.get("/health")
            if health.json() != {"status": "ok"}:
                report.broke(f"anonymous /health told {health.text}")
            for path, headers, status in expected:
                got = (await http.get(path, headers=headers)).status_code
                if got == status:
                    report.refused(f"http {status}")
                else:
                    report.broke(f"{path} answered {got}, not {status}")
            try:
                async with target.connect():
                    report.broke("a WebSocket without a key was accepted")
            except websockets.InvalidStatus as denied:
                report.refused(f"ws {denied.response.status_code}")
    return report


async def test_anonymous_and_other_keys_learn_nothing(tmp_path):
    """/health without a key is liveness only; metrics and another key's
    session are refused; a huge ``after`` is a 400, not a
    500. (That no key or token reaches the log, even at debug, is
    tests/e2e/test_secrets.py's.)"""
    path, keys = keys_file(tmp_path, alice=(["realtime"], 0), bob=(["realtime"], 0))
    server = ServerProcess("memory", api_keys_file=path).start()
    try:
        owner = await WsClient.connect(server.ws_url, additional_headers=bearer(keys["alice"]))
        session_id = (await owner.expect("session.created"))["session"]["id"]

        async def probe(target: Target, stop: asyncio.Event) -> AttackReport:
            return await anonymous_probe(target, stop, session_id, keys["bob"])

        report = await under_attack(server, probe, additional_headers=bearer(keys["alice"]))
        assert report.refusals["ws 401"] == report.attempts
    finally:
        server.stop()
