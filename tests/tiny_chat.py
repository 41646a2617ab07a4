"""A tiny chat LLM built here: a character tokenizer with a chat template and
a 2-layer Llama, trained for a few seconds on CPU until its greedy answers
are exactly the scripted replies below. Tests then know what it will say."""

from __future__ import annotations

from pathlib import Path

CAPITAL = "The capital of Spain is Madrid."
HELLO = "Hello, friend!"
BONJOUR = "Bonjour!"
FRENCH = "Answer in French."
# (system instructions, user turn, reply): the user turn in the spellings a
# recogniser or a person may give it.
SCRIPT = [
    *[
        ("", question, CAPITAL)
        for question in (
            "What is the capital of Spain?",
            "what is the capital of spain",
            "What is the capital of Spain.",
            "What is the capital of spain?",
        )
    ],
    ("", "Say hello.", HELLO),
    (FRENCH, "Say hello.", BONJOUR),
]
CHARS = " abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\n:;-"
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat(user: str, system: str = "") -> list[dict[str, str]]:
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": user}]


def tiny_chat_model(directory: Path, seed: int = 0) -> Path:
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
    end = vocab["<|im_end|>"]
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        eos_token_id=end,
        pad_token_id=vocab["<pad>"],
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    rows, labels = [], []
    for system, user, reply in SCRIPT:
        prompt = tokenizer.apply_chat_template(
            chat(user, system), add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        answer_ids = tokenizer(reply, add_special_tokens=False).input_ids + [end]
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(map(len, rows))
    pad = vocab["<pad>"]
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    target = torch.tensor([row + [-100] * (width - len(row)) for row in labels])
    mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(400):
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


def trained_chat_model(base: Path) -> Path:
    """The trained model, built once per test run (under ``base``)."""
    if not _built:
        _built.append(tiny_chat_model(base / "tiny-chat"))
    return _built[0]
