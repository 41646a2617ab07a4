"""Conversation items and content parts, shared by client and server events."""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

ItemType = Literal["message", "function_call", "function_call_output"]
Role = Literal["user", "assistant", "system"]
ItemStatus = Literal["completed", "in_progress", "incomplete"]


class ContentPart(msgspec.Struct, omit_defaults=True):
    # The server sends GA spellings (input_text | input_audio | output_text |
    # output_audio); beta connections get text | audio (protocol.dialect).
    # Clients may send either.
    type: str
    text: str | UnsetType = UNSET
    audio: str | UnsetType = UNSET  # base64, only when a client sends audio content
    transcript: str | None | UnsetType = UNSET
    image_url: str | UnsetType = UNSET  # input_image: a URL or a data: URL, kept as sent
    detail: Literal["auto", "low", "high"] | UnsetType = UNSET


class ConversationItem(msgspec.Struct, omit_defaults=True):
    type: ItemType = "message"
    id: str | UnsetType = UNSET
    object: str = "realtime.item"
    role: Role | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET
    content: list[ContentPart] = msgspec.field(default_factory=list)
    call_id: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET
    output: str | UnsetType = UNSET


class ServerItem(ConversationItem, omit_defaults=False):
    """An item as the server sends it: ``type`` and ``object`` always present
    (OpenAI's item models require ``type``; omitting defaults dropped both).
    Unset optional fields are still left out."""
