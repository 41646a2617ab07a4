"""What a model can do, as ``session.created`` announces it: clients branch
on these facts, never on model names, and the server refuses every gated
surface on a model that lacks it (PROTOCOL.md, "Server → client")."""

from __future__ import annotations

import msgspec


class Capabilities(msgspec.Struct):
    implementation_level: str
    chunk_period_ms: int
    supports_input_append: bool
    supports_barge_in: bool
    supports_session_resume: bool
    supports_audio_truncate: bool
    supports_multi_session: bool
    input_modes: list[str]
    input_formats: list[str]
    output_formats: list[str]
