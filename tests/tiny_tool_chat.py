"""A tiny chat LLM that calls a tool, built here like tests/tiny_chat.py: a
character tokenizer, a Hermes-style chat template (tools in the system
message, calls as ``<tool_call>{json}</tool_call>``, outputs as
``<tool_response>`` user turns) and a 2-layer Llama trained for a few
seconds until its greedy answers are exactly the scripted ones below, so a
test knows what it will say, tool calls included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
QUESTION = "What is the weather in Paris?"
LET_ME_CHECK = "Let me check."
ARGUMENTS = {"city": "Paris"}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = "Sunny, 21 C"
FOLLOW_UP = "It is sunny in Paris."
NO_TOOLS = "I cannot check the weather."
ROME = "Weather in Rome?"
ROME_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
BROKEN = "Break the tool."
BROKEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'
HELLO = "Hello, friend!"

CHARS = " abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\n:;-{}\"<>/_[]"
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n{% endif %}"
    "Tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}<|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n"
    "{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n"
    "{%- elif m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{%- for c in m.get('tool_calls', []) %}<tool_call>\n"
    '{"name": "{{ c[\'function\'][\'name\'] }}", "arguments": '
    "{{ c['function']['arguments'] | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tools() -> list[dict[str, Any]]:
    """The tool as the chat template gets it (the server's shape)."""
    function = {k: v for k, v in WEATHER_TOOL.items() if k != "type"}
    return [{"type": "function", "function": function}]


def _call_message(content: str) -> dict[str, Any]:
    function = {"name": "get_weather", "arguments": ARGUMENTS}
    call = {"type": "function", "id": "c1", "function": function}
    return {"role": "assistant", "content": content, "tool_calls": [call]}


def script() -> list[tuple[list[dict[str, Any]], bool, str]]:
    """(messages, tools offered, the reply)."""
    user = {"role": "user", "content": QUESTION}
    answered = [
        [user, _call_message(content), {"role": "tool", "tool_call_id": "c1", "content": WEATHER}]
        for content in (LET_ME_CHECK, "")
    ]
    return [
        ([user], True, LET_ME_CHECK + CALL_TEXT),
        *[(chat, True, FOLLOW_UP) for chat in answered],
        ([user], False, NO_TOOLS),
        ([{"role": "user", "content": ROME}], True, ROME_CALL),
        ([{"role": "user", "content": BROKEN}], True, BROKEN_CALL),
        ([{"role": "user", "content": "Say hello."}], False, HELLO),
        ([{"role": "user", "content": "Say hello."}], True, HELLO),
    ]


def tiny_tool_model(directory: Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: index for index, token in enumerate([*specials, *CHARS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials[2:]})
    tokenizer.chat_template = TEMPLATE
    end, pad = vocab["<|im_end|>"], vocab["<pad>"]
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        eos_token_id=end,
        pad_token_id=pad,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    rows, labels = [], []
    for messages, offered, reply in script():
        prompt = tokenizer.apply_chat_template(
            messages, tools=tools() if offered else None, add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        answer_ids = tokenizer(reply, add_special_tokens=False).input_ids + [end]
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(map(len, rows))
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    target = torch.tensor([row + [-100] * (width - len(row)) for row in labels])
    mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
    optimiser = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(600):
        loss = model(input_ids=ids, attention_mask=mask, labels=target).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if loss.item() < 0.002:
            break
    model.eval()
    model.generation_config.eos_token_id = end
    model.generation_config.pad_token_id = pad
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


_built: list[Path] = []


def trained_tool_model(base: Path) -> Path:
    """The trained model, built once per test run (under ``base``)."""
    if not _built:
        _built.append(tiny_tool_model(base / "tiny-tool-chat"))
    return _built[0]


def call_arguments() -> str:
    """The arguments of the trained call, as the server reports them."""
    return json.dumps(ARGUMENTS)
