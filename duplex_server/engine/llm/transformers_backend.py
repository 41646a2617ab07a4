"""The transformers AR backend: one decode thread steps every active request
together, one token each per forward.

The thread first loads the checkpoint (``loaded`` turns true), then loops:
requests that arrived wait in line; as many as the batch has room for
(``max_num_seqs`` active at most) are prefilled together, in one forward of
their prompts left-padded to a common length (as many as fit a budget of
``max_prefill_tokens`` padded tokens; the first one always goes), and join
the step batch; then one forward advances the whole batch by a token. The
batch's KV cache is one ``DynamicCache`` whose rows are left-padded to a
common length, with an attention mask saying which columns are real and
position ids counted per row, so a request sees the same positions it
would alone, whoever it was prefilled or decoded beside. A request that
ends (end of sequence, its token cap) or is abandoned (its stream was
closed, cancelled or aborted) leaves the batch before the next forward,
freeing its slot for the next in line; columns that became padding in
every row are cut.

Deltas cross to the event loop with ``call_soon_threadsafe``; a request that
left is never written to again, so nothing decoded after an abort reaches
its stream.

A prompt is kept within the context window (``--llm-max-model-len``, or the
checkpoint's ``max_position_embeddings``): the responder drops whole old
turns first (``context_window.fit_chat``, through ``prompt_tokens``); what
is still too long loses its start here, and an answer stops where the window
ends. If the decode thread itself fails (anything a forward raises that is
not one request's fault), every request ends with the reason, the backend
reports itself not loaded (``/ready`` answers 503) and refuses new requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from duplex_server.engine.core import EngineRequest
from duplex_server.engine.llm.chat_template import check_has_template, render_prompt
from duplex_server.engine.llm.context_window import prompt_budget
from duplex_server.engine.llm.interface import ChatPayload

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Padded prompt tokens one prefill forward takes at most (rows x the longest
# prompt among them): arrivals beyond it wait for the next forward, so one
# burst of long prompts does not stall the decode steps of the others.
MAX_PREFILL_TOKENS = 4096


class GenerationFailed(Exception):
    """The model failed while decoding this request (or could not load)."""


@dataclass
class _End:
    error: str | None = None


@dataclass
class _Active:
    request_id: str
    payload: ChatPayload
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[str | _End]
    generated: list[int] = field(default_factory=list)
    emitted: str = ""  # the text already sent
    length: int = 0  # real tokens in its cache rows (its next position)
    prompt: list[int] | None = None  # its prompt's token ids, once tokenized


class TransformersBackend:
    """Engine backend: ``generate(request)`` yields text deltas of a
    :class:`ChatPayload`'s answer. Counts its forwards (``prefills``,
    ``steps``) and the rows of every one (``prefill_sizes``, ``step_sizes``)."""

    def __init__(
        self,
        path: Path,
        dtype: str = "auto",
        chat_template: str | None = None,
        max_model_len: int | None = None,
        device: str = "cpu",
        max_num_seqs: int = 64,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS,
        threads: int = 1,
    ) -> None:
        if max_num_seqs < 1 or max_prefill_tokens < 1:
            raise ValueError("max_num_seqs and max_prefill_tokens must be at least 1")
        self.path = path
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self._threads = threads
        self._dtype = dtype
        self._device = torch.device(device)
        self._chat_template = chat_template
        self._max_model_len = max_model_len
        self._window = max_model_len or 0  # set from the checkpoint when it loads
        self._lock = threading.Condition()
        self._tokenizer_lock = threading.Lock()  # the decode thread and prompt_tokens share it
        self._joining: list[_Active] = []  # arrived (any thread); the decode thread takes them
        self._waiting: deque[_Active] = deque()  # in line for a slot (the decode thread's)
        self._leaving: set[str] = set()
        self._closed = False
        self._active: list[_Active] = []
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # (batch, cache columns) 1 = real
        self._loaded = threading.Event()
        self.load_error: str | None = None
        self.prefills = 0
        self.steps = 0
        self.prefill_sizes: list[int] = []
        self.step_sizes: list[int] = []
        self._sampler = torch.Generator().manual_seed(0)
        self._thread = threading.Thread(target=self._run, name="llm-decode", daemon=True)
        self._thread.start()

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set() and self.load_error is None

    @property
    def context_tokens(self) -> int:
        return self._window

    def prompt_tokens(self, payload: ChatPayload) -> int:
        """The prompt's length in tokens (blocking: call it off the event loop)."""
        with self._tokenizer_lock:
            text = render_prompt(self.tokenizer, payload, self._chat_template)
            return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._loaded.wait(timeout) and self.load_error is None

    async def generate(self, request: EngineRequest[ChatPayload]) -> AsyncIterator[str]:
        active = _Active(
            request.request_id, request.payload, asyncio.get_running_loop(), asyncio.Queue()
        )
        with self._lock:
            if self._closed:
                raise GenerationFailed("the LLM engine is shut down")
            if self.load_error is not None:
                raise GenerationFailed(self.load_error)
            self._joining.append(active)
            self._lock.notify()
        try:
            while True:
                item = await active.out.get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise GenerationFailed(item.error)
                    return
                yield item
        finally:
            # Ended, closed early (abort) or cancelled (barge-in): either way
            # it leaves the batch before the next forward.
            with self._lock:
                self._leaving.add(active.request_id)
                self._lock.notify()

    def close(self) -> None:
        """Stop the decode thread (at server shutdown): requests in flight
        end with the reason; the thread finishes its current forward first."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join()

    # --- the decode thread --------------------------------------------------

    def _run(self) -> None:
        if self._device.type == "cpu":
            # OpenMP's thread count is the calling thread's: this sets the
            # decode thread's alone. Its threads meet at a barrier every op;
            # on cores that ASR, TTS and other processes also want, one that
            # is descheduled stalls the rest (a tiny model's step measured
            # 230-385 ms on 2 threads against 14-29 ms on 1, on the shared
            # 2-core machine at load 8), so one thread is the default.
            torch.set_num_threads(self._threads)
        try:
            self._load()
        except (OSError, ValueError, RuntimeError) as exc:
            self.load_error = f"cannot load {self.path}: {exc}"
            logger.error("llm: %s", self.load_error)
            self._loaded.set()
            self._fail_all(self.load_error)
            return
        self._loaded.set()
        logger.info("llm: loaded %s", self.path)
        try:
            self._decode_loop()
        except Exception as exc:  # noqa: BLE001 - the thread's end: reported, never hidden
            logger.exception("llm: the decode thread failed")
            self._die(f"the LLM engine failed: {type(exc).__name__}: {exc}")

    def _decode_loop(self) -> None:
        while True:
            with self._lock:
                while not (self._joining or self._waiting or self._active or self._closed):
                    self._lock.wait()
                if self._closed:
                    break
                self._waiting.extend(self._joining)
                self._joining = []
                leaving, self._leaving = self._leaving, set()
            self._drop(leaving)
            self._waiting = deque(a for a in self._waiting if a.request_id not in leaving)
            group = self._admit()
            if group:
                self._prefill(group)
            if self._active:
                self._step()
        with self._lock:
            joining, self._joining = self._joining, []
        for active in [*self._active, *self._waiting, *joining]:
            self._send(active, _End("the LLM engine is shut down"))

    def _admit(self) -> list[_Active]:
        """The requests in line that join now: as many as there are free
        slots, in order of arrival, within the prefill token budget (the
        first always, however long its prompt)."""
        group: list[_Active] = []
        width = 0
        while self._waiting and len(self._active) + len(group) < self.max_num_seqs:
            active = self._waiting[0]
            if active.prompt is None:
                self._guarded(active, self._tokenize)
                if active.prompt is None:  # its prompt broke: it ended
                    self._waiting.popleft()
                    continue
            longest = max(width, len(active.prompt))
            if group and longest * (len(group) + 1) > self.max_prefill_tokens:
                break
            group.append(self._waiting.popleft())
            width = longest
        return group

    def _die(self, reason: str) -> None:
        """The decode thread cannot go on: every request ends with ``reason``,
        and the backend is no longer loaded."""
        self.load_error = reason
        for active in self._active:
            self._send(active, _End(reason))
        for active in self._waiting:
            self._send(active, _End(reason))
        self._active, self._cache, self._mask = [], None, None
        self._waiting.clear()
        self._fail_all(reason)

    def _load(self) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        check_has_template(self.tokenizer, self._chat_template)
        dtype = _DTYPES.get(self._dtype, "auto")
        model = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype, local_files_only=True)
        # (transformers' stubs type `to` as a decorated wrapper mypy misreads)
        self.model = model.to(self._device).eval()  # type: ignore[arg-type]
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        checkpoint_window = getattr(self.model.config, "max_position_embeddings", None)
        self._window = self._max_model_len or checkpoint_window or 4096

    def _fail_all(self, error: str) -> None:
        with self._lock:
            joining, self._joining = self._joining, []
        for active in joining:
            self._send(active, _End(error))

    def _guarded(self, active: _Active, work: object) -> None:
        try:
            work(active)  # type: ignore[operator]
        except (RuntimeError, ValueError, IndexError) as exc:
            # This request's prompt broke (too long, template error): it ends
            # with the reason; the others go on.
            self._send(active, _End(f"generation failed: {exc}"))

    def _tokenize(self, active: _Active) -> None:
        with self._tokenizer_lock:
            text = render_prompt(self.tokenizer, active.payload, self._chat_template)
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
        # Still too long after the responder dropped old turns: keep its end,
        # leaving the answer its room.
        active.prompt = list(ids[-prompt_budget(self._window, active.payload.max_new_tokens) :])

    @torch.inference_mode()
    def _prefill(self, group: list[_Active]) -> None:
        """The group's prompts in one forward, left-padded to the longest
        (padding masked out, positions counted per row); each row's first
        token comes from it, and the rows join the step batch."""
        prompts = [active.prompt or [] for active in group]
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=self._device)
        mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self._device
        )
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        try:
            logits = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1]
        except RuntimeError as exc:
            for active in group:
                self._send(active, _End(f"generation failed: {exc}"))
            return
        self.prefills += 1
        self.prefill_sizes.append(len(group))
        for active, prompt in zip(group, prompts, strict=True):
            active.length = len(prompt)
        self._join(group, cache, mask)
        self._advance(group, logits)

    def _join(self, group: list[_Active], cache: DynamicCache, mask: torch.Tensor) -> None:
        """Their cache rows beside the batch's, both left-padded to one length."""
        if self._cache is None or self._mask is None:
            self._cache, self._mask, self._active = cache, mask, list(group)
            return
        width = max(self._mask.shape[1], mask.shape[1])
        layers = []
        for (old_k, old_v), (new_k, new_v) in zip(_kv(self._cache), _kv(cache), strict=True):
            keys = torch.cat([_pad_left(old_k, width), _pad_left(new_k, width)])
            values = torch.cat([_pad_left(old_v, width), _pad_left(new_v, width)])
            layers.append((keys, values))
        self._mask = torch.cat([_pad_left(self._mask, width, dim=1), _pad_left(mask, width, dim=1)])
        self._cache = DynamicCache(layers, config=self.model.config)
        self._active.extend(group)

    def _drop(self, request_ids: set[str]) -> None:
        keep = [index for index, a in enumerate(self._active) if a.request_id not in request_ids]
        if len(keep) == len(self._active):
            return
        if not keep:
            self._active, self._cache, self._mask = [], None, None
            return
        assert self._cache is not None and self._mask is not None
        rows = torch.tensor(keep, device=self._device)
        mask = self._mask.index_select(0, rows)
        first = int(mask.any(dim=0).nonzero()[0])  # columns before it: padding in every row
        self._mask = mask[:, first:]
        layers = [
            (keys.index_select(0, rows)[:, :, first:], values.index_select(0, rows)[:, :, first:])
            for keys, values in _kv(self._cache)
        ]
        self._cache = DynamicCache(layers, config=self.model.config)
        self._active = [self._active[index] for index in keep]

    @torch.inference_mode()
    def _step(self) -> None:
        assert self._cache is not None and self._mask is not None
        batch = len(self._active)
        last = torch.tensor([[a.generated[-1]] for a in self._active], device=self._device)
        positions = torch.tensor([[a.length] for a in self._active], device=self._device)
        mask = torch.cat([self._mask, self._mask.new_ones((batch, 1))], dim=1)
        try:
            logits = self.model(
                input_ids=last,
                attention_mask=mask,
                position_ids=positions,
                cache=self._cache,
                use_cache=True,
            ).logits[:, -1]
        except RuntimeError as exc:
            for active in self._active:
                self._send(active, _End(f"generation failed: {exc}"))
            self._active, self._cache, self._mask = [], None, None
            return
        self.steps += 1
        self.step_sizes.append(batch)
        self._mask = mask
        for active in self._active:
            active.length += 1
        self._advance(list(self._active), logits)

    def _advance(self, actives: list[_Active], logits: torch.Tensor) -> None:
        """One sampled token per row; deltas out (the step's, together);
        finished rows leave."""
        finished = []
        outbox: list[tuple[_Active, str | _End]] = []
        for active, token in zip(actives, self._sample(actives, logits), strict=True):
            done = token in self._eos
            if not done:
                active.generated.append(token)
                delta = self._new_text(active)
                if delta:
                    outbox.append((active, delta))
            full = len(active.generated) >= active.payload.max_new_tokens
            if done or full or active.length + 1 >= self._window:
                finished.append(active)
        # Out of the batch before its end is told: whoever hears the end
        # finds the batch without it.
        self._drop({active.request_id for active in finished})
        outbox.extend((active, _End()) for active in finished)
        self._send_all(outbox)

    def _sample(self, actives: list[_Active], logits: torch.Tensor) -> list[int]:
        """Each row's next token: greedy rows from one argmax over the batch
        (one device-to-host copy a step, not one a row), sampled rows on the
        host's seeded generator."""
        tokens: list[int] = logits.argmax(dim=-1).tolist()
        for row, active in enumerate(actives):
            temperature = active.payload.temperature
            if temperature > 0:
                probs = torch.softmax(logits[row].float().cpu() / temperature, dim=-1)
                tokens[row] = int(torch.multinomial(probs, 1, generator=self._sampler))
        return tokens

    def _new_text(self, active: _Active) -> str:
        """The text its last token added ("" while a character split across
        tokens waits for its end)."""
        with self._tokenizer_lock:
            text = str(self.tokenizer.decode(active.generated, skip_special_tokens=True))
        if text.endswith("\ufffd"):
            return ""
        delta, active.emitted = text[len(active.emitted) :], text
        return delta

    def _send_all(self, outbox: list[tuple[_Active, str | _End]]) -> None:
        """A step's deltas and ends, one hop per event loop (not one per
        request: with every session on the server's loop, a step of 32
        answers wakes it once)."""
        with self._lock:
            live = [(a, item) for a, item in outbox if a.request_id not in self._leaving]
        loops: dict[asyncio.AbstractEventLoop, list[tuple[_Active, str | _End]]] = {}
        for active, item in live:
            loops.setdefault(active.loop, []).append((active, item))
        for loop, items in loops.items():
            # A closed event loop (RuntimeError) has nobody listening.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_deliver, items)

    def _send(self, active: _Active, item: str | _End) -> None:
        with self._lock:
            if active.request_id in self._leaving:
                return  # its stream is gone; nothing more reaches it
        # A closed event loop (RuntimeError) has nobody listening.
        with contextlib.suppress(RuntimeError):
            active.loop.call_soon_threadsafe(active.out.put_nowait, item)


def _deliver(items: list[tuple[_Active, str | _End]]) -> None:
    for active, item in items:
        active.out.put_nowait(item)


def _kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values; a layer of another kind (linear
    attention) is not batched here yet."""
    pairs = []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            raise ValueError(f"cache layer {type(layer).__name__} cannot be batched")
        pairs.append((keys, values))
    return pairs


def _pad_left(tensor: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
