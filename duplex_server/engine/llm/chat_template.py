"""The prompt of a chat: the tokenizer's chat template (or ``--llm-chat-template``)
applied to a :class:`ChatPayload`, the same way for every backend, so an answer
does not depend on which engine decodes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from duplex_server.engine.llm.interface import ChatPayload, LLMConfigError


def read_chat_template(path: str | None) -> str | None:
    """The text of ``--llm-chat-template``, refused at start-up if unreadable."""
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LLMConfigError(f"--llm-chat-template {path}: cannot read it ({exc})") from exc


def check_chat_template(directory: Path, override: str | None) -> None:
    """Refuse at start-up a checkpoint that has no chat template, unless
    ``--llm-chat-template`` gives one: its files say so without loading it
    (transformers writes ``chat_template.jinja``, older versions a
    ``chat_template`` key in ``tokenizer_config.json`` or a
    ``chat_template.json``)."""
    if override is not None:
        return
    if any((directory / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return
    config = directory / "tokenizer_config.json"
    try:
        settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LLMConfigError(f"--llm {directory}: cannot read {config.name} ({exc})") from exc
    if not settings.get("chat_template"):
        raise LLMConfigError(
            f"--llm {directory}: the checkpoint has no chat template (no chat_template.jinja, "
            "no chat_template in tokenizer_config.json); give one with --llm-chat-template FILE"
        )


def check_has_template(tokenizer: Any, override: str | None) -> None:
    """A checkpoint without a chat template cannot be prompted: say so at load."""
    if override is None and tokenizer.chat_template is None:
        raise ValueError(
            "its tokenizer has no chat template; give one with --llm-chat-template FILE"
        )


def render_prompt(tokenizer: Any, payload: ChatPayload, override: str | None) -> str:
    """The text the model continues: messages (and tools, when any) through the
    template, ending with the assistant's generation prompt and the answer's
    forced beginning, if any."""
    prompt = tokenizer.apply_chat_template(
        payload.messages,
        tools=payload.tools or None,
        chat_template=override,
        add_generation_prompt=True,
        tokenize=False,
    )
    return str(prompt) + payload.answer_prefix
