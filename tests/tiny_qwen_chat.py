"""A tiny Qwen2 chat model built here for vLLM: a byte-level BPE tokenizer
trained on the scripted conversations, a Hermes-style chat template (the
tool model's, tests/tiny_tool_chat.py: without tools it renders a chat as
the plain template does), and a 2-layer Qwen2 (hidden 128, 2 heads, so
head_dim 64: vLLM's CPU attention has no smaller head size), trained for a
few seconds on CPU until its greedy answers are the scripted replies:
one-turn questions (in the spellings a recogniser may give them), a long
answer to cut, a question asked after that answer was cut unheard, a
follow-up that needs the turn before it, and a tool call with its answered
follow-up. Tests then know what either backend will say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests import tiny_tool_chat
from tests.tiny_chat import BONJOUR, CAPITAL, FRENCH, HELLO, chat

TEMPLATE = tiny_tool_chat.TEMPLATE
# A long reply, for tests that must stop an answer in the middle of it.
COUNT = "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve."
COUNT_QUESTION = "Count to twelve."
CAPITAL_QUESTIONS = (
    "What is the capital of Spain?",
    "what is the capital of spain",
    "What is the capital of Spain.",
    "What is the capital of spain?",
)
# A follow-up answered only from the turn before it: the chat must hold it.
FRANCE_QUESTION = "And of France?"
FRANCE = "The capital of France is Paris."
SCRIPT = [
    *[("", question, CAPITAL) for question in CAPITAL_QUESTIONS],
    ("", "Say hello.", HELLO),
    (FRENCH, "Say hello.", BONJOUR),
    ("", COUNT_QUESTION, COUNT),
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def conversations() -> list[tuple[list[dict[str, Any]], bool, str]]:
    """Everything it is trained on: (messages, tools offered, the reply)."""
    follow_up = [
        {"role": "user", "content": CAPITAL_QUESTIONS[0]},
        {"role": "assistant", "content": CAPITAL},
        {"role": "user", "content": FRANCE_QUESTION},
    ]
    # the call, its answered follow-ups, and a plain answer with tools offered
    wanted = (tiny_tool_chat.LET_ME_CHECK + tiny_tool_chat.CALL_TEXT, tiny_tool_chat.FOLLOW_UP)
    tools = [
        (messages, offered, reply)
        for messages, offered, reply in tiny_tool_chat.script()
        if reply in wanted or (offered and reply == HELLO)
    ]
    # A question after an answer cut before anything of it was heard (it is
    # not in the chat then): the last question is the one answered.
    after_cut = [
        [{"role": "user", "content": COUNT_QUESTION}, {"role": "user", "content": question}]
        for question in CAPITAL_QUESTIONS
    ]
    return [
        *[(chat(user, system), False, reply) for system, user, reply in SCRIPT],
        (follow_up, False, FRANCE),
        *[(messages, False, CAPITAL) for messages in after_cut],
        *tools,
    ]


def _tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|endoftext|>", eos_token="<|im_end|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def _rendered(tokenizer: Any, messages: list[dict[str, Any]], offered: bool) -> str:
    return tokenizer.apply_chat_template(
        messages,
        tools=tiny_tool_chat.tools() if offered else None,
        add_generation_prompt=True,
        tokenize=False,
    )


def tiny_qwen_chat_model(directory: Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    script = conversations()
    # The BPE merges come from the conversations' words, the replies (the
    # call's JSON among them) and the template's own words.
    corpus = [
        "\n".join([*(str(m["content"]) for m in messages), reply]) for messages, _, reply in script
    ]
    corpus.append("system\nuser\nassistant\nTools: get_weather\n<tool_response>\n</tool_response>")
    tokenizer = _tokenizer(corpus)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=end,
        pad_token_id=pad,
        bos_token_id=None,
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    rows, labels = [], []
    for messages, offered, reply in script:
        prompt_ids = tokenizer(
            _rendered(tokenizer, messages, offered), add_special_tokens=False
        ).input_ids
        answer_ids = tokenizer(reply, add_special_tokens=False).input_ids + [end]
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    batches = _batches(rows, labels, pad)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(600):
        optimiser.zero_grad()
        loss = sum(
            model(input_ids=ids, attention_mask=mask, labels=target).loss * share
            for ids, mask, target, share in batches
        )
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


def _batches(rows: list[list[int]], labels: list[list[int]], pad: int) -> list[tuple]:
    """The short conversations and the long ones (the tool turns) as two
    padded batches, each with its share of the answer tokens: their weighted
    losses add up to the whole set's mean loss, at half the padding's cost."""
    import torch

    order = sorted(range(len(rows)), key=lambda index: len(rows[index]))
    split = next((n for n, index in enumerate(order) if len(rows[index]) > 64), len(order))
    groups = [group for group in (order[:split], order[split:]) if group]
    answer_tokens = sum(sum(label != -100 for label in row[1:]) for row in labels)
    batches = []
    for group in groups:
        width = max(len(rows[index]) for index in group)
        ids = torch.tensor([rows[i] + [pad] * (width - len(rows[i])) for i in group])
        target = torch.tensor([labels[i] + [-100] * (width - len(labels[i])) for i in group])
        lengths = torch.tensor([len(rows[i]) for i in group])
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        share = int((target[:, 1:] != -100).sum()) / answer_tokens
        batches.append((ids, mask, target, share))
    return batches


_built: list[Path] = []


def trained_qwen_chat_model(base: Path) -> Path:
    """The trained model, built once per test run (under ``base``)."""
    if not _built:
        _built.append(tiny_qwen_chat_model(base / "tiny-qwen-chat"))
    return _built[0]
