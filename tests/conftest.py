"""Shared fixtures: a real server on a free port, in this test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import uvicorn

from duplex_bench.redis_process import RedisServer
from duplex_bench.server_process import free_port
from duplex_server.app import create_app
from duplex_server.config import ServerConfig
from duplex_server.sessions.core.state import SessionState, fold, initial_state
from duplex_server.sessions.runtime.manager import SessionManager
from duplex_server.transport import uvicorn_config
from tests import openai_conformance
from tests.wsclient import WsClient


@dataclass
class RunningServer:
    config: ServerConfig
    app: object
    final_states: dict[str, SessionState] = field(default_factory=dict)
    final_records: dict[str, list] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"127.0.0.1:{self.config.port}"

    @property
    def ws_url(self) -> str:
        # events=both: the raw test clients see the journal as it is, both
        # spellings (tests/e2e/test_dialects.py covers the GA and beta projections)
        return f"ws://{self.base}/v1/realtime?duplex=1&events=both"

    @property
    def http_url(self) -> str:
        return f"http://{self.base}"

    @property
    def manager(self) -> SessionManager:
        return self.app.state.manager  # type: ignore[attr-defined]

    async def connect(self, query: str = "", **kwargs) -> WsClient:
        url = self.ws_url + (f"&{query}" if query else "")
        return await WsClient.connect(url, **kwargs)

    async def open(self, query: str = "") -> tuple[WsClient, dict]:
        client = await self.connect(query)
        created = await client.expect("session.created")
        return client, created

    async def assert_replay_determinism(self) -> None:
        """Rule 2 of the log: refolding every session's log yields its final state.

        Sessions are stopped first, so no append is in flight while comparing.
        """
        log = self.app.state.log  # type: ignore[attr-defined]
        await self.manager.shutdown()
        assert not self.manager.actors
        for session_id, state in self.final_states.items():
            kept = self.final_records.get(session_id)
            records = kept if kept is not None else await log.read(session_id)
            model = self.app.state.model  # type: ignore[attr-defined]
            rebuilt = fold(
                records, initial_state(session_id, model.name, model.turn_detection_types)
            )
            assert rebuilt == state, f"refold of {session_id} differs from the live state"


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def server(request, tmp_path) -> AsyncIterator[RunningServer]:
    """The real server, once per log backend: every scenario runs on all three."""
    overrides = {}
    marker = request.node.get_closest_marker("server_config")
    if marker is not None:
        overrides = dict(marker.kwargs)
    if request.param == "memory":
        store = "memory"
    elif request.param == "sqlite":
        store = f"sqlite:{tmp_path / 'sessions.db'}"
    else:
        store = request.getfixturevalue("redis_server").url
        overrides.setdefault("redis_prefix", f"t{uuid.uuid4().hex[:12]}")
    overrides.setdefault("model", "echo")
    config = ServerConfig(port=free_port(), store=store, **overrides)
    async with running_server(config) as running:
        yield running
        await running.assert_replay_determinism()


def bound_listener(config: ServerConfig) -> socket.socket:
    """A socket already bound for the server, and ``config.port`` set to it.

    ``free_port()`` only names a port that was free a moment ago: another
    test process may bind it before uvicorn does (uvicorn then exits with
    3). Binding here first, and falling back to a port the kernel picks,
    closes that race; the app is built after, so it sees the real port.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((config.host, config.port))
    except OSError:
        listener.bind((config.host, 0))
    config.port = listener.getsockname()[1]
    return listener


@contextlib.asynccontextmanager
async def running_server(config: ServerConfig) -> AsyncIterator[RunningServer]:
    """The app under uvicorn in this event loop; final actor states captured."""
    listener = bound_listener(config)
    app = create_app(config)
    running = RunningServer(config, app)
    manager: SessionManager = app.state.manager
    original = manager._closed

    def capture(session_id: str, reason: str) -> None:
        actor = manager.actors.get(session_id)
        if actor is not None:
            running.final_states[session_id] = actor.state
        original(session_id, reason)

    manager._closed = capture  # type: ignore[method-assign]
    log = app.state.log
    delete = log.delete

    async def keep_then_delete(session_id: str) -> None:
        # The memory store drops a closed session's log at once: keep it for
        # the refold check.
        running.final_records[session_id] = await log.read(session_id)
        await delete(session_id)

    log.delete = keep_then_delete
    uv = uvicorn.Server(uvicorn_config(app, config, log_level="warning"))
    task = asyncio.create_task(uv.serve(sockets=[listener]))
    while not uv.started:
        await asyncio.sleep(0.01)
    try:
        yield running
    finally:
        uv.should_exit = True
        await task


@contextlib.asynccontextmanager
async def serving_llm(*flags: str) -> AsyncIterator[RunningServer]:
    """The cascade answering with ``--llm`` (the ``serve`` flags given), once
    its weights are loaded; its sessions' logs refold to their final states."""
    from duplex_server import cli

    config = cli.serve_config(list(flags), {})
    config.port = free_port()
    async with running_server(config) as running:
        model = running.app.state.model  # type: ignore[attr-defined]
        while not model.loaded:  # the weights load on the engine's thread
            await asyncio.sleep(0.05)
        yield running
        await running.assert_replay_determinism()


@contextlib.asynccontextmanager
async def phrase_server(tmp_path, request, phrases: list[str]) -> AsyncIterator[RunningServer]:
    """The cascade model listening for ``phrases`` (a PocketSphinx grammar;
    memory store); a ``server_config`` marker overrides settings. Its refold
    must equal the live state when the test ends."""
    path = tmp_path / "phrases.txt"
    path.write_text("\n".join(phrases))
    marker = request.node.get_closest_marker("server_config")
    config = ServerConfig(
        port=free_port(),
        store="memory",
        model="cascade",
        asr_phrases=str(path),
        **(marker.kwargs if marker else {}),
    )
    async with running_server(config) as running:
        yield running
        await running.assert_replay_determinism()


@pytest.fixture
async def voice_server(tmp_path, request) -> AsyncIterator[RunningServer]:
    """The cascade model listening for the test phrases."""
    from tests.speech import PHRASES

    async with phrase_server(tmp_path, request, PHRASES) as running:
        yield running


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One real redis-server for the whole run; tests keep apart by key prefix."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def openai_conformance_check():
    """Fail any test that received a server event the openai SDK's models reject
    (tests/openai_conformance.py); torn down last, so teardown traffic counts too."""
    openai_conformance.install()
    openai_conformance.violations.clear()
    yield
    found = list(openai_conformance.violations)
    openai_conformance.violations.clear()
    assert not found, f"{len(found)} server events fail the openai SDK's models:\n" + "\n".join(
        str(v) for v in found[:5]
    )


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "server_config(**kwargs): ServerConfig overrides")


# Files of a minute or more each (`pytest --durations`: vLLM's engine starts,
# a browser's reconnects): collected first, so that under `-n 2 --dist
# loadfile` the two workers share them instead of one worker finishing the
# run alone with the last of them. Any order is correct; this one is faster.
HEAVY_FIRST = (
    "tests/e2e/test_vllm_processes.py",
    "tests/e2e/test_browser_resume.py",  # between the two vLLM files: one each
    "tests/test_vllm_engine.py",
    "tests/e2e/test_llm_backends.py",
    "tests/e2e/test_bench_cli.py",
    "tests/e2e/test_batch_bench.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {path: place for place, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))
