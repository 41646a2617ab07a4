"""Tiny chat LLMs built here, trained for a few seconds on CPU until their
greedy answers are exactly the scripted replies, saved with
``save_pretrained``: whoever runs one knows what it will say. One machinery
(a tokenizer with a chat template, a 2-layer model, a masked-loss training
loop, a save) serves four scripts:

- ``build``: the model ``bench llm`` runs when no ``--llm PATH`` is given
  (a Llama over characters). Its script holds the bench's text prompts and
  the spoken phrases of ``bench voice --phrases`` (as its phrase-grammar
  recogniser writes them), so every turn has a known answer of a known length;
- ``tiny_chat_model``: the tests' plain chat model (a smaller Llama over
  characters): a question in the spellings a recogniser or a person may give
  it, a greeting, and the greeting under system instructions;
- ``tiny_tool_model``: the tests' tool-calling model: a Hermes-style chat
  template (tools in the system message, calls as
  ``<tool_call>{json}</tool_call>``, outputs as ``<tool_response>`` user turns);
- ``tiny_qwen_chat_model``: the tests' model for vLLM: a byte-level BPE
  tokenizer trained on its conversations, the tool template (without tools it
  renders a chat as the plain template does) and a 2-layer Qwen2 (hidden 128,
  2 heads, so head_dim 64: vLLM's CPU attention has no smaller head size). Its
  script: the plain chat model's, a long answer to cut, a question asked after
  that answer was cut unheard, a follow-up that needs the turn before it, and
  the tool call with its answered follow-up. Tests then know what either
  backend will say.

They live in the bench package (benches cannot import ``tests/``); the tests
import them from here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from duplex_bench.voice_phrases import PHRASES

Messages = list[dict[str, Any]]
# (messages, tools offered, the reply)
Conversation = tuple[Messages, bool, str]
# (input ids, attention mask, labels, the batch's share of the answer tokens)
Batch = tuple[Any, Any, Any, float]

CHARS = " abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\n:;-"
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAR_SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]


def chat(user: str, system: str = "") -> Messages:
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": user}]


# --- the machinery ---------------------------------------------------------------


def char_tokenizer(chars: str, template: str) -> Any:
    """One token a character (``chars``) and the four specials, with ``template``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate([*CHAR_SPECIALS, *chars])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": CHAR_SPECIALS[2:]})
    tokenizer.chat_template = template
    return tokenizer


def llama(
    tokenizer: Any, hidden: int, heads: int, positions: int, seed: int
) -> tuple[Any, int, int]:
    """A fresh 2-layer Llama over ``tokenizer`` (seeded), its end and pad ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<pad>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=positions,
        eos_token_id=end,
        pad_token_id=pad,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config), end, pad


def token_rows(
    tokenizer: Any, conversations: list[Conversation], end: int, tools: Messages | None = None
) -> tuple[list[list[int]], list[list[int]]]:
    """Each conversation's rendered prompt and reply as ids, and its labels
    (the reply and the end token; the prompt masked out)."""
    rows, labels = [], []
    for messages, offered, reply in conversations:
        prompt = tokenizer.apply_chat_template(
            messages, tools=tools if offered else None, add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        answer_ids = tokenizer(reply, add_special_tokens=False).input_ids + [end]
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    return rows, labels


def padded(rows: list[list[int]], labels: list[list[int]], pad: int, share: float = 1.0) -> Batch:
    """The rows as one right-padded batch."""
    import torch

    width = max(map(len, rows))
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    target = torch.tensor([row + [-100] * (width - len(row)) for row in labels])
    mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
    return ids, mask, target, share


def train_and_save(
    model: Any,
    tokenizer: Any,
    batches: list[Batch],
    end: int,
    pad: int,
    directory: Path,
    *,
    lr: float,
    steps: int,
) -> Path:
    """AdamW on the batches' weighted loss until it is all but zero (or
    ``steps``), then save the model and its tokenizer into ``directory``."""
    import torch

    optimiser = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
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


_built: dict[str, Path] = {}


def built_once(base: Path, name: str, builder: Callable[[Path], Path]) -> Path:
    """``builder``'s model, built once per process (under ``base / name``)."""
    if name not in _built:
        _built[name] = builder(base / name)
    return _built[name]


# --- the bench's model -------------------------------------------------------------

# (the user's turn, the trained reply): text prompts first, then the phrases
BENCH_SCRIPT: list[tuple[str, str]] = [
    ("What is the capital of Spain?", "The capital of Spain is Madrid, a city in the middle."),
    ("Say hello.", "Hello, friend! It is good to hear from you today."),
    ("Count to ten.", "One, two, three, four, five, six, seven, eight, nine, ten."),
    ("Name three colours.", "Red, green and blue are three colours of the rainbow."),
    *[(phrase, f"Sure. You asked me to {phrase}, and I will.") for phrase in PHRASES],
]
TEXT_PROMPTS = [user for user, _ in BENCH_SCRIPT[:4]]
TRAIN_STEPS = 600


def build(directory: Path, seed: int = 0) -> Path:
    """Train the bench's model and save it (with its tokenizer) into ``directory``."""
    import torch

    tokenizer = char_tokenizer(CHARS, TEMPLATE)
    # One thread: on a shared CPU a second one waits at every op's barrier
    # for a descheduled peer (training took minutes instead of seconds).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, end, pad = llama(tokenizer, hidden=128, heads=2, positions=256, seed=seed)
        script = [(chat(user), False, reply) for user, reply in BENCH_SCRIPT]
        batch = padded(*token_rows(tokenizer, script, end), pad)
        return train_and_save(
            model, tokenizer, [batch], end, pad, directory, lr=3e-3, steps=TRAIN_STEPS
        )
    finally:
        torch.set_num_threads(threads)


# --- the tests' plain chat model -----------------------------------------------------

CAPITAL = "The capital of Spain is Madrid."
HELLO = "Hello, friend!"
BONJOUR = "Bonjour!"
FRENCH = "Answer in French."
CAPITAL_QUESTIONS = (
    "What is the capital of Spain?",
    "what is the capital of spain",
    "What is the capital of Spain.",
    "What is the capital of spain?",
)
# (system instructions, user turn, reply): the user turn in the spellings a
# recogniser or a person may give it.
CHAT_SCRIPT = [
    *[("", question, CAPITAL) for question in CAPITAL_QUESTIONS],
    ("", "Say hello.", HELLO),
    (FRENCH, "Say hello.", BONJOUR),
]


def tiny_chat_model(directory: Path, seed: int = 0) -> Path:
    tokenizer = char_tokenizer(CHARS, TEMPLATE)
    model, end, pad = llama(tokenizer, hidden=64, heads=4, positions=256, seed=seed)
    script = [(chat(user, system), False, reply) for system, user, reply in CHAT_SCRIPT]
    batch = padded(*token_rows(tokenizer, script, end), pad)
    return train_and_save(model, tokenizer, [batch], end, pad, directory, lr=3e-3, steps=400)


def trained_chat_model(base: Path) -> Path:
    """The trained model, built once per test run (under ``base``)."""
    return built_once(base, "tiny-chat", tiny_chat_model)


# --- the tests' tool-calling model ---------------------------------------------------

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

TOOL_CHARS = CHARS + '{}"<>/_[]'
TOOL_TEMPLATE = (
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


def tools() -> Messages:
    """The tool as the chat template gets it (the server's shape)."""
    function = {k: v for k, v in WEATHER_TOOL.items() if k != "type"}
    return [{"type": "function", "function": function}]


def _call_message(content: str) -> dict[str, Any]:
    function = {"name": "get_weather", "arguments": ARGUMENTS}
    call = {"type": "function", "id": "c1", "function": function}
    return {"role": "assistant", "content": content, "tool_calls": [call]}


def tool_script() -> list[Conversation]:
    """(messages, tools offered, the reply)."""
    user = {"role": "user", "content": QUESTION}
    answered = [
        [user, _call_message(content), {"role": "tool", "tool_call_id": "c1", "content": WEATHER}]
        for content in (LET_ME_CHECK, "")
    ]
    return [
        ([user], True, LET_ME_CHECK + CALL_TEXT),
        *[(messages, True, FOLLOW_UP) for messages in answered],
        ([user], False, NO_TOOLS),
        ([{"role": "user", "content": ROME}], True, ROME_CALL),
        ([{"role": "user", "content": BROKEN}], True, BROKEN_CALL),
        ([{"role": "user", "content": "Say hello."}], False, HELLO),
        ([{"role": "user", "content": "Say hello."}], True, HELLO),
    ]


def tiny_tool_model(directory: Path, seed: int = 0) -> Path:
    tokenizer = char_tokenizer(TOOL_CHARS, TOOL_TEMPLATE)
    model, end, pad = llama(tokenizer, hidden=64, heads=4, positions=512, seed=seed)
    batch = padded(*token_rows(tokenizer, tool_script(), end, tools()), pad)
    return train_and_save(model, tokenizer, [batch], end, pad, directory, lr=5e-3, steps=600)


def trained_tool_model(base: Path) -> Path:
    """The trained model, built once per test run (under ``base``)."""
    return built_once(base, "tiny-tool-chat", tiny_tool_model)


def call_arguments() -> str:
    """The arguments of the trained call, as the server reports them."""
    return json.dumps(ARGUMENTS)


# --- the tests' Qwen2 model for vLLM -------------------------------------------------

# A long reply, for tests that must stop an answer in the middle of it.
COUNT = "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve."
COUNT_QUESTION = "Count to twelve."
# A follow-up answered only from the turn before it: the chat must hold it.
FRANCE_QUESTION = "And of France?"
FRANCE = "The capital of France is Paris."
QWEN_SCRIPT = [*CHAT_SCRIPT, ("", COUNT_QUESTION, COUNT)]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def qwen_conversations() -> list[Conversation]:
    """Everything it is trained on: (messages, tools offered, the reply)."""
    follow_up = [
        {"role": "user", "content": CAPITAL_QUESTIONS[0]},
        {"role": "assistant", "content": CAPITAL},
        {"role": "user", "content": FRANCE_QUESTION},
    ]
    # the call, its answered follow-ups, and a plain answer with tools offered
    wanted = (LET_ME_CHECK + CALL_TEXT, FOLLOW_UP)
    with_tools = [
        (messages, offered, reply)
        for messages, offered, reply in tool_script()
        if reply in wanted or (offered and reply == HELLO)
    ]
    # A question after an answer cut before anything of it was heard (it is
    # not in the chat then): the last question is the one answered.
    after_cut = [
        [{"role": "user", "content": COUNT_QUESTION}, {"role": "user", "content": question}]
        for question in CAPITAL_QUESTIONS
    ]
    return [
        *[(chat(user, system), False, reply) for system, user, reply in QWEN_SCRIPT],
        (follow_up, False, FRANCE),
        *[(messages, False, CAPITAL) for messages in after_cut],
        *with_tools,
    ]


def _bpe_tokenizer(texts: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=QWEN_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|endoftext|>", eos_token="<|im_end|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_SPECIALS[1:]})
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def tiny_qwen_chat_model(directory: Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    script = qwen_conversations()
    # The BPE merges come from the conversations' words, the replies (the
    # call's JSON among them) and the template's own words.
    corpus = [
        "\n".join([*(str(m["content"]) for m in messages), reply]) for messages, _, reply in script
    ]
    corpus.append("system\nuser\nassistant\nTools: get_weather\n<tool_response>\n</tool_response>")
    tokenizer = _bpe_tokenizer(corpus)
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
    rows, labels = token_rows(tokenizer, script, end, tools())
    batches = _batches(rows, labels, pad)
    return train_and_save(model, tokenizer, batches, end, pad, directory, lr=3e-3, steps=600)


def _batches(rows: list[list[int]], labels: list[list[int]], pad: int) -> list[Batch]:
    """The short conversations and the long ones (the tool turns) as two
    padded batches, each with its share of the answer tokens: their weighted
    losses add up to the whole set's mean loss, at half the padding's cost."""
    order = sorted(range(len(rows)), key=lambda index: len(rows[index]))
    split = next((n for n, index in enumerate(order) if len(rows[index]) > 64), len(order))
    groups = [group for group in (order[:split], order[split:]) if group]
    answer_tokens = sum(sum(label != -100 for label in row[1:]) for row in labels)
    batches = []
    for group in groups:
        ids, mask, target, _ = padded([rows[i] for i in group], [labels[i] for i in group], pad)
        share = int((target[:, 1:] != -100).sum()) / answer_tokens
        batches.append((ids, mask, target, share))
    return batches


def trained_qwen_chat_model(base: Path) -> Path:
    """The trained model, built once per test run (under ``base``)."""
    return built_once(base, "tiny-qwen-chat", tiny_qwen_chat_model)
