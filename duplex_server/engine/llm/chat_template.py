"""The prompt of a chat: the tokenizer's chat template (or ``--llm-chat-template``)
applied to a :class:`ChatPayload`, the same way for every backend, so an answer
does not depend on which engine decodes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from duplex_server.engine.llm import ChatPayload, LLMConfigError


def read_chat_template(path: str | None) -> str | None:
    """The text of ``--llm-chat-template``, refused at start-up if unreadable."""
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LLMConfigError(f"--llm-chat-template {path}: cannot read it ({exc})") from exc


def check_has_template(tokenizer: Any, override: str | None) -> None:
    """A checkpoint without a chat template cannot be prompted: say so at load."""
    if override is None and tokenizer.chat_template is None:
        raise ValueError(
            "its tokenizer has no chat template; give one with --llm-chat-template FILE"
        )


def render_prompt(tokenizer: Any, payload: ChatPayload, override: str | None) -> str:
    """The text the model continues: messages (and tools, when any) through the
    template, ending with the assistant's generation prompt."""
    return str(
        tokenizer.apply_chat_template(
            payload.messages,
            tools=payload.tools or None,
            chat_template=override,
            add_generation_prompt=True,
            tokenize=False,
        )
    )
