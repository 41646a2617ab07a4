"""A bounded wire trace: what went over the socket, cheap enough to leave on.

Recording appends a tuple to a ``deque``; JSON export happens only when asked.
"""

from __future__ import annotations

import json
import time
from collections import deque


class DuplexTrace:
    def __init__(self, max_frames: int = 10_000, keep_payload_bytes: int = 512) -> None:
        self.frames: deque[tuple[float, str, str | bytes]] = deque(maxlen=max_frames)
        self.keep_payload_bytes = keep_payload_bytes
        self.started = time.monotonic()

    def record(self, direction: str, frame: str | bytes) -> None:
        self.frames.append((time.monotonic() - self.started, direction, frame))

    def to_json(self) -> str:
        rows = []
        for at, direction, frame in self.frames:
            text = frame.decode(errors="replace") if isinstance(frame, bytes) else frame
            head = text[: self.keep_payload_bytes]
            try:
                kind = json.loads(text).get("type")
            except (ValueError, AttributeError):
                kind = None
            rows.append(
                {
                    "t_s": round(at, 6),
                    "dir": direction,
                    "type": kind,
                    "bytes": len(text),
                    "head": head,
                }
            )
        return json.dumps({"frames": rows})

    def save(self, path: str) -> None:
        with open(path, "w") as handle:
            handle.write(self.to_json())
