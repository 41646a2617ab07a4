"""Conversation items and content parts, shared by client and server events."""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

ItemType = Literal["message", "function_call", "function_call_output"]
Role = Literal["user", "assistant", "system"]
ItemStatus = Literal["completed", "in_progress", "incomplete"]


class ContentPart(msgspec.Struct, omit_defaults=True):
    type: str  # input_text | input_audio | text | audio | output_text | output_audio
    text: str | UnsetType = UNSET
    audio: str | UnsetType = UNSET  # base64, only when a client sends audio content
    transcript: str | None | UnsetType = UNSET


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
