"""The baseline: a bare WebSocket echo on the same stack (uvicorn) as the server.

It answers ``session.heartbeat`` with an ack and echoes everything else, so
the bench drives it with the same client load and compares round trips.
"""

from __future__ import annotations

import sys

import uvicorn

from duplex_bench.server_process import ServerProcess

ACK = '{"type":"session.heartbeat_ack"}'


class EchoServerProcess(ServerProcess):
    """This module in a child process, started and stopped like the real server."""

    def __init__(self, port: int | None = None) -> None:
        super().__init__(port=port, ws_path="/")

    def command(self) -> list[str]:
        return [sys.executable, "-m", "duplex_bench.echo_server", str(self.port)]


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": '{"type":"session.created"}'})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text") or ""
        if '"session.heartbeat"' in text:
            await send({"type": "websocket.send", "text": ACK})
        else:
            await send({"type": "websocket.send", "text": text})


if __name__ == "__main__":
    # Same transport settings as `duplex-server serve` defaults, so the two
    # phases of the bench differ only in what the server does with a frame.
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        log_level="warning",
        ws_ping_interval=None,
        ws_per_message_deflate=False,
    )
