"""conversation.item.*: create (a client's item checked against OpenAI's item
models and decoded), retrieve, delete and truncate."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from duplex_server.audio import pcm16_duration_ms
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.commands.given import ModelFacts
from duplex_server.sessions.core.commands.shared import decode_audio, next_user_item_id
from duplex_server.sessions.core.effects import Effects, KeepTurn
from duplex_server.sessions.core.items import Item, Part, to_wire
from duplex_server.sessions.core.records import ItemBody
from duplex_server.sessions.core.responses import emit_twins
from duplex_server.sessions.core.state import SessionState
from duplex_server.sessions.core.tool_calls import check_function_call_output
from protocol import client_events as ce
from protocol.codec import decode_base64
from protocol.errors import ProtocolError
from protocol.items import ContentPart, ConversationItem
from protocol.server_events import (
    InputDtmfReceived,
    ItemAdded,
    ItemDeleted,
    ItemDone,
    ItemRetrieved,
    ItemTruncated,
)

# What OpenAI's item models require beyond the type (checked on the way in,
# so the item the server echoes back validates).
_REQUIRED_ITEM_FIELDS = {
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
}


def _client_item(state: SessionState, event: ce.ItemCreate) -> tuple[Item, list[bytes]]:
    """The item to store, and the pcm16 of each of its parts (b"" for text)."""
    wire = event.item
    item_id = wire.id if isinstance(wire.id, str) and wire.id else next_user_item_id(state)
    if state.find_item(item_id) is not None:
        raise ProtocolError(
            "invalid_event",
            f"item {item_id!r} already exists",
            param="item.id",
            event_id=event.event_id,
        )
    for field_name in _REQUIRED_ITEM_FIELDS.get(wire.type, ()):
        if not isinstance(getattr(wire, field_name), str):
            raise ProtocolError(
                "invalid_event",
                f"a {wire.type} item needs {field_name}",
                param=f"item.{field_name}",
                event_id=event.event_id,
            )
    if wire.type == "function_call_output":
        check_function_call_output(state, wire.call_id, event.event_id)  # type: ignore[arg-type]  # a str, checked above
    if wire.type == "message" and wire.role is UNSET:
        raise ProtocolError(
            "invalid_event",
            "a message item needs a role",
            param="item.role",
            event_id=event.event_id,
        )
    _check_content_types(event)
    parts = []
    audio: list[bytes] = []
    for index, content in enumerate(wire.content):
        param = f"item.content.{index}.audio"
        if content.type in ("input_audio", "audio") and isinstance(content.audio, str):
            fmt = state.config.input_format
            pcm = decode_audio(
                decode_base64(content.audio, param=param, event_id=event.event_id),
                fmt,
                event.event_id,
                param,
            )
            audio.append(pcm)
            parts.append(
                Part(
                    type=content.type,
                    audio_rate=fmt.sample_rate_hz,
                    audio_ms=pcm16_duration_ms(len(pcm), fmt.sample_rate_hz),
                    transcript=content.transcript or None,
                )
            )
        elif content.type == "input_image":
            audio.append(b"")
            parts.append(_image_part(content, index, event.event_id))
        else:
            text = content.text if isinstance(content.text, str) else ""
            transcript = content.transcript if isinstance(content.transcript, str) else None
            audio.append(b"")
            parts.append(Part(type=content.type, text=text, transcript=transcript))
    item = Item(
        id=item_id,
        type=wire.type,
        role=wire.role if wire.role is not UNSET else None,
        parts=parts,
        call_id=_given(wire.call_id),
        name=_given(wire.name),
        arguments=_given(wire.arguments),
        output=_given(wire.output),
    )
    return item, audio


# The content each role's messages carry, in either dialect's spelling.
_CONTENT_TYPES = {
    "user": ("input_text", "input_audio", "input_image"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio", "text", "audio"),
}


def _check_content_types(event: ce.ItemCreate) -> None:
    """A message's parts must be what its role says (an assistant speaks
    output_text/output_audio, a user input_text/input_audio, a system
    input_text); other items carry no content parts."""
    wire = event.item
    role = wire.role if isinstance(wire.role, str) else ""
    allowed = _CONTENT_TYPES.get(role, ()) if wire.type == "message" else ()
    for index, content in enumerate(wire.content):
        if content.type not in allowed:
            where = f"a {wire.role} message" if wire.type == "message" else f"a {wire.type} item"
            raise ProtocolError(
                "invalid_event",
                f"{where} cannot carry {content.type!r} content"
                + (f"; it takes {', '.join(allowed)}" if allowed else ""),
                param=f"item.content.{index}.type",
                event_id=event.event_id,
            )


def _image_part(content: ContentPart, index: int, event_id: str | None) -> Part:
    """An image the user shows: kept with its URL (a data: URL is the image
    itself) for the model and for ``conversation.item.retrieve``."""
    if not isinstance(content.image_url, str) or not content.image_url:
        raise ProtocolError(
            "invalid_event",
            "an input_image part needs an image_url",
            param=f"item.content.{index}.image_url",
            event_id=event_id,
        )
    return Part(type="input_image", image_url=content.image_url, detail=_given(content.detail))


def _given(value: str | UnsetType) -> str | None:
    return value if isinstance(value, str) else None


def item_create(batch: Batch, event: ce.ItemCreate, facts: ModelFacts) -> Effects:
    state = batch.state
    previous = event.previous_item_id
    if previous not in (None, "root") and state.find_item(previous) is None:
        raise ProtocolError(
            "item_not_found",
            f"previous_item_id {previous!r} does not exist",
            param="previous_item_id",
            event_id=event.event_id,
        )
    item, audio = _client_item(state, event)
    if previous is None and state.items:
        previous = state.items[-1].id
    batch.fact(
        ItemBody(
            op="create",
            item_id=item.id,
            item=item,
            previous_item_id=None if previous == "root" else previous,
            audio=audio,
        )
    )
    emit_twins(batch, ItemAdded(item=to_wire(item), previous_item_id=previous))
    batch.emit(ItemDone(item=to_wire(item), previous_item_id=previous))
    pcm = b"".join(audio)
    return (KeepTurn(item.id, pcm),) if pcm else ()


def dtmf_pressed(batch: Batch, event: ce.InputDtmf, facts: ModelFacts) -> Effects:
    """A telephone key the user pressed: OpenAI's
    ``input_audio_buffer.dtmf_event_received``, then a user item saying so,
    so that it is logged and the model hears it with the next turn."""
    batch.emit(InputDtmfReceived(event=event.digit, received_at=batch.now_ms // 1000))
    said = ContentPart(type="input_text", text=f"(the user pressed the {event.digit} key)")
    pressed = ConversationItem(type="message", role="user", content=[said])
    return item_create(batch, ce.ItemCreate(item=pressed, event_id=event.event_id), facts)


def _existing_item(state: SessionState, event: ce.ClientEvent, item_id: str) -> Item:
    item = state.find_item(item_id)
    if item is None:
        raise ProtocolError(
            "item_not_found",
            f"no item {item_id!r} in the conversation",
            param="item_id",
            event_id=event.event_id,
        )
    return item


def item_retrieve(batch: Batch, event: ce.ItemRetrieve, facts: ModelFacts) -> Effects:
    item = _existing_item(batch.state, event, event.item_id)
    batch.emit(ItemRetrieved(item=to_wire(item)))
    return ()


def item_delete(batch: Batch, event: ce.ItemDelete, facts: ModelFacts) -> Effects:
    _existing_item(batch.state, event, event.item_id)
    active = batch.state.response
    if active is not None and active.item_id == event.item_id:
        raise ProtocolError(
            "invalid_event",
            "the item of a response still streaming cannot be deleted: cancel it first",
            param="item_id",
            event_id=event.event_id,
        )
    batch.fact(ItemBody(op="delete", item_id=event.item_id))
    batch.emit(ItemDeleted(item_id=event.item_id))
    return ()


# Clients count whole milliseconds of what they played (Pipecat sends the
# rounded-up duration of a finished answer): that much past the end is the end.
TRUNCATE_SLACK_MS = 1.0


def item_truncate(batch: Batch, event: ce.ItemTruncate, facts: ModelFacts) -> Effects:
    model = facts.model
    item = _existing_item(batch.state, event, event.item_id)
    if not model.capabilities.supports_audio_truncate:
        raise ProtocolError(
            "capability_unsupported",
            "this model does not support truncation",
            param="type",
            event_id=event.event_id,
        )
    if (
        item.role != "assistant"
        or event.content_index >= len(item.parts)
        or (item.parts[event.content_index].type != "audio")
    ):
        raise ProtocolError(
            "invalid_event",
            "only assistant audio content can be truncated",
            param="content_index",
            event_id=event.event_id,
        )
    audio_ms = item.parts[event.content_index].audio_ms
    active = batch.state.response
    if active is not None and active.item_id == item.id:
        audio_ms = active.playback.generated_ms
    if event.audio_end_ms > audio_ms + TRUNCATE_SLACK_MS:
        raise ProtocolError(
            "invalid_event",
            f"audio_end_ms {event.audio_end_ms} is past the item's {audio_ms:.1f} ms of audio",
            param="audio_end_ms",
            event_id=event.event_id,
        )
    end_ms = min(event.audio_end_ms, audio_ms)
    batch.fact(
        ItemBody(
            op="truncate",
            item_id=item.id,
            content_index=event.content_index,
            audio_end_ms=end_ms,
        )
    )
    batch.emit(
        ItemTruncated(
            item_id=item.id,
            content_index=event.content_index,
            audio_end_ms=round(end_ms),
        )
    )
    return ()
