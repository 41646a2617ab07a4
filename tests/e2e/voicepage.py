"""The voice page's tests' helpers: a real cascade server process that hears
the test phrases, headless Chromium with a WAV file as its microphone, and
the page read as a person reads it (its text), plus the session's log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import urllib.request
import wave
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

from playwright.async_api import Browser, Page, Playwright, WebSocket, async_playwright

from tests.e2e.serverproc import ServerProcess
from tests.speech import PHRASES, silence, speak

CHROMIUM = shutil.which("chromium")
RATE = 48_000  # the WAV's rate: Chromium's fake microphone resamples it
# Flags for a closed network and no screen (see the machine notes).
QUIET = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]
# A fake microphone the browser grants without asking.
MICROPHONE = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]
WAIT_MS = 30_000


def write_wav(path: Path, *parts: bytes) -> Path:
    """A mono pcm16 WAV at ``RATE`` of ``parts`` one after another."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(b"".join(parts))
    return path


def said(phrase: str) -> bytes:
    return speak(phrase, RATE)


def quiet(ms: float) -> bytes:
    return silence(ms, RATE)


@contextlib.contextmanager
def voice_server(tmp_path: Path, store: str = "memory", **flags) -> Iterator[ServerProcess]:
    """``duplex-server serve`` with the cascade listening for the test phrases
    (PocketSphinx with a phrase grammar: recognition the tests can rely on)."""
    server = start_voice_server(tmp_path, store, **flags)
    try:
        yield server
    finally:
        server.stop()


def start_voice_server(
    tmp_path: Path, store: str = "memory", port: int | None = None, **flags
) -> ServerProcess:
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("\n".join(PHRASES))
    flags = {"model": "cascade", "asr": "pocketsphinx", "asr_phrases": phrases} | flags
    return ServerProcess(store, port=port, **flags).start(timeout_s=60)


@contextlib.asynccontextmanager
async def chromium(
    microphone: Path | None = None, *, allow_microphone: bool = True, flags: Sequence[str] = ()
) -> AsyncIterator[Browser]:
    """Headless Chromium; ``microphone`` a WAV file it hears (once, then silence)."""
    assert CHROMIUM, "chromium is not installed (make test installs the Debian package)"
    args = [*QUIET, *flags]
    if allow_microphone:
        args += MICROPHONE
    else:
        args += ["--use-fake-device-for-media-stream", "--deny-permission-prompts"]
    if microphone is not None:
        args.append(f"--use-file-for-fake-audio-capture={microphone}%noloop")
    async with async_playwright() as playwright:
        browser = await launch(playwright, args)
        try:
            yield browser
        finally:
            await browser.close()


async def launch(playwright: Playwright, args: list[str]) -> Browser:
    return await playwright.chromium.launch(executable_path=CHROMIUM, args=args)


class VoicePage:
    """The page at ``/`` read as its user reads it: by its visible text."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.console: list[str] = []
        page.on("console", lambda message: self.console.append(message.text))
        page.on("pageerror", lambda error: self.console.append(f"page error: {error}"))

    @classmethod
    async def open(
        cls,
        browser: Browser,
        url: str,
        *,
        transport: str | None = "websocket",
        init_script: str | None = None,
        **context_options,
    ) -> VoicePage:
        """The page, on ``transport`` (``?transport=``; None: the page's
        default, WebRTC where it can); ``init_script`` runs before the page's own."""
        context = await browser.new_context(**context_options)
        if init_script is not None:
            await context.add_init_script(init_script)
        page = cls(await context.new_page())
        await page.page.goto(url + "/" + (f"?transport={transport}" if transport else ""))
        # Remember every state the page shows: some last a moment only ...
        await page.page.evaluate(
            """() => {
                const node = document.querySelector('#state');
                window.statesSeen = [node.textContent];
                new MutationObserver((records) => {
                    for (const record of records) {
                        for (const added of record.addedNodes) {
                            window.statesSeen.push(added.textContent);
                        }
                    }
                }).observe(node, { childList: true });
                // ... and what the user's turns showed while they spoke.
                window.partialsSeen = [];
                const list = document.querySelector('#conversation');
                new MutationObserver(() => {
                    for (const text of list.querySelectorAll('.turn.user.partial .text')) {
                        if (window.partialsSeen.at(-1) !== text.textContent) {
                            window.partialsSeen.push(text.textContent);
                        }
                    }
                }).observe(list, { childList: true, subtree: true, characterData: true });
            }"""
        )
        return page

    def frames_received(self) -> list[str]:
        """Every text frame the page's sockets receive from now on."""
        frames: list[str] = []

        def watch(socket: WebSocket) -> None:
            socket.on(
                "framereceived",
                lambda payload: frames.append(payload) if isinstance(payload, str) else None,
            )

        self.page.on("websocket", watch)
        return frames

    def frames_by_kind(self) -> dict[str, list[str | bytes]]:
        """Every frame the page's sockets send ("sent") and receive
        ("received") from now on, text and binary."""
        frames: dict[str, list[str | bytes]] = {"sent": [], "received": []}

        def watch(socket: WebSocket) -> None:
            socket.on("framesent", lambda payload: frames["sent"].append(payload))
            socket.on("framereceived", lambda payload: frames["received"].append(payload))

        self.page.on("websocket", watch)
        return frames

    async def subprotocols_offered(self) -> list[str]:
        """The ``Sec-WebSocket-Protocol`` header of every WebSocket handshake
        the page sends from now on, as it goes on the wire (Chromium's
        DevTools protocol sees the request headers)."""
        offered: list[str] = []
        devtools = await self.page.context.new_cdp_session(self.page)
        await devtools.send("Network.enable")

        def handshake(params: dict) -> None:
            headers = {k.lower(): v for k, v in params["request"]["headers"].items()}
            offered.append(headers.get("sec-websocket-protocol", ""))

        devtools.on("Network.webSocketWillSendHandshakeRequest", handshake)
        return offered

    async def states_seen(self) -> list[str]:
        """Each state the page has shown since it opened, in order."""
        return await self.page.evaluate("window.statesSeen")

    async def partials_seen(self) -> list[str]:
        """Each text a user turn showed while it was still partial."""
        return await self.page.evaluate("window.partialsSeen")

    async def start(self, key: str | None = None) -> None:
        # The model list has loaded once the model menu names a model.
        await self.page.wait_for_function(
            "document.querySelector('#model').value !== ''", timeout=WAIT_MS
        )
        if key is not None:
            await self.page.fill("#key", key)
        await self.page.click("#start")

    async def text(self, selector: str) -> str:
        return await self.page.inner_text(selector)

    async def state(self) -> str:
        return await self.text("#state")

    async def wait_text(self, selector: str, wanted: str, timeout_ms: int = WAIT_MS) -> str:
        """Wait until ``selector``'s visible text contains ``wanted``."""
        await self.page.wait_for_function(
            "([selector, wanted]) => {"
            "  const node = document.querySelector(selector);"
            "  return node !== null && node.innerText.includes(wanted);"
            "}",
            arg=[selector, wanted],
            timeout=timeout_ms,
        )
        return await self.text(selector)

    async def wait_state(self, wanted: str, timeout_ms: int = WAIT_MS) -> None:
        await self.wait_text("#state", wanted, timeout_ms)

    async def session_id(self) -> str:
        await self.page.wait_for_function(
            "document.querySelector('#session').innerText.startsWith('sess_')", timeout=WAIT_MS
        )
        return await self.text("#session")

    async def turns(self, who: str) -> list[str]:
        """The visible text of each of ``who``'s turns ("user" or "assistant")."""
        return await self.page.locator(f"#conversation .turn.{who} .text").all_inner_texts()


def log_lines(server: ServerProcess, session_id: str, key: str | None = None) -> list[dict]:
    """The session's log as ``GET /v1/sessions/{id}/events`` serves it."""
    request = urllib.request.Request(f"{server.http_url}/v1/sessions/{session_id}/events")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return [json.loads(line) for line in response.read().splitlines()]


class DroppingProxy:
    """A TCP forwarder to a server whose connections the test can drop at
    once, as a network that fails would, while the server lives on."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> DroppingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def drop(self) -> None:
        """Reset every connection open now; new ones are forwarded again."""
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        self._writers.discard(sink)
        sink.transport.abort()
