"""The event orders PROTOCOL.md fixes, as lists the tests compare against."""

COMMIT_FANOUT = [  # OpenAI's order: committed, then the item
    "input_audio_buffer.committed",
    "conversation.item.added",
    "conversation.item.created",
    "conversation.item.done",
]
RESPONSE_OPEN = [
    "response.created",
    "conversation.item.added",
    "conversation.item.created",
    "response.output_item.added",
    "response.content_part.added",
    "response.speak",
]
AUDIO_CHUNK = [
    "response.output_audio.delta",
    "response.audio.delta",
    "response.output_audio_transcript.delta",
    "response.audio_transcript.delta",
]
RESPONSE_CLOSE = [
    "response.output_audio.done",
    "response.audio.done",
    "response.output_audio_transcript.done",
    "response.audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
]
TEXT_CLOSE = [
    "response.output_text.done",
    "response.text.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
]


# Who has the floor, told once at the end of each batch that changed it: the
# assistant generating once the answer opens, playing once its audio goes out.
TURN_EVENT = "turn.event"


def answer_audio(chunks: int) -> list[str]:
    """An answer's audio chunks; the floor passes to the playing assistant
    after the first."""
    if not chunks:
        return []
    return AUDIO_CHUNK + [TURN_EVENT] + AUDIO_CHUNK * (chunks - 1)


def full_turn(chunks: int) -> list[str]:
    return COMMIT_FANOUT + RESPONSE_OPEN + [TURN_EVENT] + answer_audio(chunks) + RESPONSE_CLOSE
