"""The tiny chat model ``bench llm`` runs when no ``--llm PATH`` is given:
a character tokenizer with a chat template and a 2-layer Llama, trained for
a few seconds on CPU until its greedy answers are the scripted replies
below, saved with ``save_pretrained``. The script holds the bench's text
prompts and the spoken phrases of ``bench voice --phrases`` (as its
phrase-grammar recogniser writes them), so every turn has a known answer of
a known length. Benches ship in the package and cannot import ``tests/``,
which builds its own (``tests/tiny_chat.py``)."""

from __future__ import annotations

from pathlib import Path

from duplex_bench.voice_phrases import PHRASES

CHARS = " abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\n:;-"
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# (the user's turn, the trained reply): text prompts first, then the phrases
SCRIPT: list[tuple[str, str]] = [
    ("What is the capital of Spain?", "The capital of Spain is Madrid, a city in the middle."),
    ("Say hello.", "Hello, friend! It is good to hear from you today."),
    ("Count to ten.", "One, two, three, four, five, six, seven, eight, nine, ten."),
    ("Name three colours.", "Red, green and blue are three colours of the rainbow."),
    *[(phrase, f"Sure. You asked me to {phrase}, and I will.") for phrase in PHRASES],
]
TEXT_PROMPTS = [user for user, _ in SCRIPT[:4]]
TRAIN_STEPS = 600


def chat(user: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}]


def build(directory: Path, seed: int = 0) -> Path:
    """Train the model and save it (with its tokenizer) into ``directory``."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

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
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=end,
        pad_token_id=pad,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    # One thread: on a shared CPU a second one waits at every op's barrier
    # for a descheduled peer (training took minutes instead of seconds).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(model_dir=directory, config=config, tokenizer=tokenizer, end=end, pad=pad)
    finally:
        torch.set_num_threads(threads)


def _train(model_dir: Path, config, tokenizer, end: int, pad: int) -> Path:
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(config)
    rows, labels = [], []
    for user, reply in SCRIPT:
        prompt = tokenizer.apply_chat_template(
            chat(user), add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        answer_ids = tokenizer(reply, add_special_tokens=False).input_ids + [end]
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(map(len, rows))
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    target = torch.tensor([row + [-100] * (width - len(row)) for row in labels])
    mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(TRAIN_STEPS):
        loss = model(input_ids=ids, attention_mask=mask, labels=target).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if loss.item() < 0.002:
            break
    model.eval()
    model.generation_config.eos_token_id = end
    model.generation_config.pad_token_id = pad
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir
