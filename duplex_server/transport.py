"""How the server meets the network: uvicorn's settings, one place for the
CLI and the tests, so the limits the tests exercise are the ones served."""

from __future__ import annotations

import uvicorn
from starlette.applications import Starlette

from duplex_server.config import ServerConfig

# Room around an event's largest field: a frame up to max_frame_bytes plus
# this is read and refused with a coded payload_too_large; anything larger is
# refused by the WebSocket layer (close 1009) before it is buffered.
FRAME_ENVELOPE_BYTES = 64 * 1024


def uvicorn_config(
    app: Starlette, config: ServerConfig, *, log_level: str | None = None
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level or config.log_level,
        ws_max_size=config.max_frame_bytes + FRAME_ENVELOPE_BYTES,
        ws_ping_interval=None,
        ws_per_message_deflate=config.ws_per_message_deflate,
    )
