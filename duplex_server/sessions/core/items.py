"""Conversation items as the session keeps them, and their wire projection.

Items hold audio *metadata* only (rate, duration, and ``audio_ref``: the seqs
of the log records that carry the samples). The samples stay in the log, so
compacting them away never changes the folded state; the actor keeps the
recent turns' pcm in a cache for the model. ``history_ms`` is how much of an
assistant item counts as history (playback truth), ``marks`` map audio time
to transcript length.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from protocol.items import ContentPart, ServerItem


class Part(msgspec.Struct):
    type: str  # input_audio | input_text | audio | text | output_text
    text: str = ""
    transcript: str | None = None
    audio_rate: int = 0
    audio_ms: float = 0.0
    audio_ref: tuple[int, int] | None = None  # first and last seq holding the samples
    image_url: str | None = None  # input_image: kept as the client sent it
    detail: str | None = None


class Item(msgspec.Struct):
    id: str
    type: str = "message"
    role: str | None = None
    status: str = "completed"
    parts: list[Part] = msgspec.field(default_factory=list)
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    marks: list[tuple[float, int]] = msgspec.field(default_factory=list)
    history_ms: float | None = None
    truncated: bool = False


def transcript_at(marks: list[tuple[float, int]], transcript: str, end_ms: float) -> str:
    """The transcript prefix spoken by ``end_ms``, by the audio-text marks."""
    cut = 0
    for mark_ms, chars in marks:
        if mark_ms > end_ms + 1e-6:
            break
        cut = chars
    return transcript[:cut]


# Assistant content in GA spelling; beta connections get the short names back
# (protocol.dialect). Inside the session an assistant part stays audio | text.
_ASSISTANT_PART = {"audio": "output_audio", "text": "output_text"}


def _wire_part(part: Part, role: str | None) -> ContentPart:
    kind = _ASSISTANT_PART.get(part.type, part.type) if role == "assistant" else part.type
    if part.type in ("input_text", "text", "output_text"):
        return ContentPart(type=kind, text=part.text)
    if part.type == "input_image":
        return ContentPart(
            type=kind,
            image_url=part.image_url if part.image_url is not None else UNSET,
            detail=part.detail if part.detail is not None else UNSET,  # type: ignore[arg-type]  # validated
        )
    return ContentPart(type=kind, transcript=part.transcript)


def to_wire(item: Item) -> ServerItem:
    return ServerItem(
        type=item.type,  # type: ignore[arg-type]  # stored from a validated item
        id=item.id,
        role=item.role if item.role is not None else UNSET,  # type: ignore[arg-type]  # validated
        status=item.status,  # type: ignore[arg-type]  # the fold sets only these
        content=[_wire_part(part, item.role) for part in item.parts],
        call_id=item.call_id if item.call_id is not None else UNSET,
        name=item.name if item.name is not None else UNSET,
        arguments=item.arguments if item.arguments is not None else UNSET,
        output=item.output if item.output is not None else UNSET,
    )


def item_text(item: Item) -> str:
    """What the item says, as text: typed text or the audio's transcript."""
    pieces = [part.text or (part.transcript or "") for part in item.parts]
    return " ".join(piece for piece in pieces if piece)
