"""The frame-synchronous batched step of a Moshi-architecture model.

One ``tick`` advances every live row by one 80 ms frame, all rows at once:

1. Mimi streaming encode of each row's newest 1920 input samples;
2. one step of the temporal transformer over the row's previous column
   (its own text token and audio codes, and the user's codes) with the
   batch's KV cache;
3. the depth decoder's codebooks one by one, from the text token the
   temporal step chose;
4. Mimi streaming decode of the frame whose codes are now complete.

Moshi's delays (the reference ones: text and codebook 0 undelayed, every
other codebook one frame late) are kept in the layout of a *column*: the
temporal step at a row's frame ``t`` reads column ``t`` and the depth
decoder writes column ``t + 1``, which holds the text token and codebook 0
of frame ``t + 1`` but codebooks 1.. of frame ``t``. Frame ``t``'s codes are
therefore complete at tick ``t`` (codebook 0 from the previous column), and
a row's first frame (whose codebook 0 is the begin-of-stream token) has no
audio: it is silence.

A row may be primed before its first real frame (a persona and a voice
prompt, as PersonaPlex conditions its model): ``join(prefix)`` runs the
prompt's ``PrimeFrame``s teacher-forced in a batch of its own and splices
the row in, so the live rows do not wait for it; ``resume`` replays the
same prefix before the logged frames.

Rows join and leave between ticks. A joining row's transformer positions
restart behind a mask (``RowTimeline``) and its codec state is reset, so
it computes what it would alone; a freed row is reused by the next join.
A row decodes greedily, or samples at its stream's temperature with noise
drawn from its own seed and frame number (``sampling``); either way its
output is a function of its input (and seed) alone: what makes "batched
equals alone" and the teacher-forced ``prefill`` (a restarted replica
rebuilding a row from its logged frames) testable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache, MoshiForConditionalGeneration

from duplex_server.engine.duplex.mimi_graph import GraphMimiDecoder, GraphMimiEncoder
from duplex_server.engine.duplex.mimi_stream import MimiStreamDecoder, MimiStreamEncoder
from duplex_server.engine.duplex.sampling import (
    AUDIO_TOP_K,
    GREEDY,
    TEXT_TOP_K,
    Draw,
    Sampling,
    choose,
    draw,
)
from duplex_server.engine.duplex.splice import splice_row
from duplex_server.engine.duplex.timeline import RowTimeline
from duplex_server.engine.duplex.tokens import FrameTokens, PrimeFrame

# A stepper's Mimi streamers: transformers' caches (eager), or static shapes (graphed).
Encoder = MimiStreamEncoder | GraphMimiEncoder
Decoder = MimiStreamDecoder | GraphMimiDecoder


class RowsFull(Exception):
    """Every row of the batch is live: nobody can join until one leaves."""


@dataclass(frozen=True)
class RowFrame:
    """One live row's share of a tick: the tokens it generated (to log) and
    the 1920 samples of its voice for frame ``step`` (silence at step 0)."""

    step: int
    tokens: FrameTokens
    samples: np.ndarray


class DuplexStepper:
    """A batch of ``rows`` rows of one Moshi model, advanced together.

    Not thread-safe: one thread owns it and calls ``join``, ``leave`` and
    ``tick`` in turn.
    """

    def __init__(self, model: MoshiForConditionalGeneration, rows: int) -> None:
        self.model = model
        self.rows = rows
        config = model.config
        self.num_codebooks = config.num_codebooks
        self.frame_samples = int(model.audio_encoder.config.frame_size)
        self.text_start = config.vocab_size  # the begin-of-stream ids: one past each vocabulary
        self.audio_start = int(config.audio_vocab_size or model.audio_encoder.config.codebook_size)
        self.audio_vocab = int(model.depth_decoder.lm_heads.weight.shape[1])
        self.live = [False] * rows
        self.step = [0] * rows
        self.sampling = [GREEDY] * rows
        self._fresh_state()

    def _fresh_state(self) -> None:
        """Empty caches and codec state: a batch nobody has used yet."""
        rows, device = self.rows, self.model.device
        model = self.model
        self.encoder, self.decoder = self._codec()
        self.cache = DynamicCache(config=model.config)
        self.timeline = RowTimeline(rows, 1, device)
        # the column each row's next temporal step reads (its own tokens) ...
        self.text_in = torch.full((rows,), self.text_start, dtype=torch.long, device=device)
        self.audio_in = torch.full(
            (rows, self.num_codebooks), self.audio_start, dtype=torch.long, device=device
        )
        # ... and the user's codebooks 1.. of the previous frame (one frame late)
        self.user_late = torch.full_like(self.audio_in[:, 1:], self.audio_start)

    def _codec(self) -> tuple[Encoder, Decoder]:
        """A fresh Mimi streaming encoder and decoder for every row."""
        mimi = self.model.audio_encoder
        return MimiStreamEncoder(mimi, self.rows, self.num_codebooks), MimiStreamDecoder(
            mimi, self.rows
        )

    def _eager_codec(self) -> tuple[MimiStreamEncoder, MimiStreamDecoder]:
        """The codec of a stepper that rebuilds (prefills) a row: the eager
        streamers, which take many frames in one call."""
        encoder, decoder = self.encoder, self.decoder
        if not isinstance(encoder, MimiStreamEncoder) or not isinstance(decoder, MimiStreamDecoder):
            raise TypeError("only a stepper with the eager Mimi streamers rebuilds a row")
        return encoder, decoder

    def join(self, prefix: Sequence[PrimeFrame] = ()) -> int:
        """Take a free row for a new stream; its state starts fresh at the next tick,
        or (with a ``prefix``) as it is after those prime frames.

        The first join into an empty batch starts the whole batch afresh, so
        the shared timeline (and its caches) stop growing once nobody is left.
        """
        if prefix:
            return self.resume([], prefix)
        if not any(self.live) and self.timeline.length:
            self._fresh_state()
        try:
            row = self.live.index(False)
        except ValueError:
            raise RowsFull(f"all {self.rows} rows are live") from None
        self.live[row] = True
        self.step[row] = 0
        self.sampling[row] = GREEDY
        self.text_in[row] = self.text_start
        self.audio_in[row] = self.audio_start
        self.user_late[row] = self.audio_start
        self.timeline.reset(row)
        self.encoder.reset(row)
        return row

    @torch.no_grad()
    def resume(
        self,
        history: Sequence[tuple[np.ndarray, FrameTokens]],
        prefix: Sequence[PrimeFrame] = (),
    ) -> int:
        """Take a free row for a stream that already ran its ``prefix`` (the
        prime frames it was joined with) and then ``len(history)`` frames.

        ``history`` is each past frame's input samples and the tokens the
        model generated then, in order, as a session logs them. The row is
        rebuilt by a teacher-forced prefill in a batch of its own (so the
        live rows do not move) and spliced into this batch; its next tick
        continues as if it had never stopped. ``resume(h)`` is
        ``adopt(rebuild(model, h))``: a server runs ``rebuild`` off the
        tick thread and only the splice between ticks.
        """
        if not history and not prefix:
            return self.join()
        return self.adopt(DuplexStepper.rebuild(self.model, history, prefix))

    @staticmethod
    @torch.no_grad()
    def rebuild(
        model: MoshiForConditionalGeneration,
        history: Sequence[tuple[np.ndarray, FrameTokens]],
        prefix: Sequence[PrimeFrame] = (),
    ) -> DuplexStepper:
        """A batch of one whose row 0 is the stream its ``prefix`` (prime
        frames) and ``history`` left off, rebuilt by a teacher-forced
        prefill; touches no other stepper.

        The temporal transformer takes the history a window of frames a
        forward (the logged tokens give every column at once), each query
        masked to the newest ``sliding_window`` positions as a tick's is
        (Moshi's own mask is plain causal; only its cache slides), so a call
        past the window is rebuilt exactly, not replayed tick by tick. The
        codec streams the same frames a window a call (one more across a
        row's first frame, where ``tick`` restarts the decoder), so a
        rebuild's memory is a window's, not the whole call's.
        """
        alone = DuplexStepper(model, 1)
        source = alone.join()
        for prime in prefix:
            alone.prime_tick({source: prime})
        if history:
            alone._prefill(history)
        return alone

    def _prefill(self, history: Sequence[tuple[np.ndarray, FrameTokens]]) -> None:
        """Row 0 of a batch of one (fresh, or primed) brought to where
        ``history`` left off: what ``len(history)`` forced ticks leave, in
        one temporal forward a window of frames."""
        device = self.model.device
        past, first_step = self.timeline.length, self.step[0]
        logged = torch.tensor(
            [[tokens.text, *tokens.audio] for _, tokens in history], dtype=torch.long, device=device
        )
        user = self._prefill_codec(history, logged[:, 1:], first_step)
        # column t: the tokens generated at tick t - 1 (first: the row's current column)
        columns = torch.cat([torch.cat([self.text_in, self.audio_in[0]])[None], logged[:-1]])
        late = torch.cat([self.user_late, user[:-1, 1:]])  # the user's codebooks 1.. a frame late
        user_columns = torch.cat([user[:, :1], late], dim=1)
        model, k = self.model, self.num_codebooks
        embeds = model.decoder.model.embed_tokens(columns[:, 0])
        for codebook in range(k):
            embeds = embeds + model.embed_tokens[codebook](columns[:, 1 + codebook])
            embeds = embeds + model.embed_tokens[k + codebook](user_columns[:, codebook])
        frames = len(history)
        chunk = self._prefill_chunk(frames)
        for begin in range(0, frames, chunk):
            end = min(frames, begin + chunk)
            positions = torch.arange(past + begin, past + end, device=device)
            model.decoder(
                inputs_embeds=embeds[None, begin:end],
                attention_mask=self._window_mask(past + begin, positions),
                position_ids=positions[None],
                cache=self.cache,
                use_cache=True,
            )
        self.timeline.length += frames
        self.text_in = logged[-1:, 0].clone()
        self.audio_in = logged[-1:, 1:].clone()
        self.user_late = user[-1:, 1:].clone()
        self.step[0] = first_step + frames

    def _window_mask(self, seen: int, positions: torch.Tensor) -> torch.Tensor:
        """The additive (1, 1, queries, keys) mask of a prefill forward at
        ``positions`` over what the cache holds after ``seen`` positions
        (the newest ``sliding_window - 1``, or all) and the queries' own."""
        window = self.model.config.sliding_window
        held = min(seen, window - 1) if isinstance(window, int) and window > 0 else seen
        keys = torch.arange(seen - held, int(positions[-1]) + 1, device=positions.device)
        query = positions[:, None]
        allowed = keys[None, :] <= query
        if isinstance(window, int) and window > 0:
            allowed &= keys[None, :] > query - window
        dtype = self.model.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device)
        return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]

    def _prefill_codec(
        self,
        history: Sequence[tuple[np.ndarray, FrameTokens]],
        own: torch.Tensor,
        first_step: int,
    ) -> torch.Tensor:
        """The codec's streaming state through ``history``, a window of frames
        an encode and a decode (a decode more across the row's first frame),
        as ``tick`` leaves it frame by frame; returns the user's codes of
        every frame."""
        frames = len(history)
        chunk = self._prefill_chunk(frames)
        encoder, decoder = self._eager_codec()
        user = torch.cat(
            [
                encoder.encode_frames(self._samples(history[begin : begin + chunk]))
                for begin in range(0, frames, chunk)
            ],
            dim=-1,
        )[0].T
        # frame t's codes: codebook 0 from column t, codebooks 1.. from column t + 1
        first = torch.cat([self.audio_in[0, :1], own[:-1, 0]])
        codes = torch.cat([first[:, None], own[:, 1:]], dim=1).clamp(max=self.audio_start - 1)
        restart = 1 - first_step  # as tick: a row's codec output starts at its frame 1
        cut = restart if 0 < restart < frames else 0
        if cut:
            decoder.decode_frames(codes[:cut].T[None])
        if 0 <= restart < frames:
            decoder.reset(0)
        for part in codes[cut:].split(chunk):
            decoder.decode_frames(part.T[None])
        return user

    def _prefill_chunk(self, frames: int) -> int:
        """Frames a forward of a prefill: the temporal window (a call's memory
        is a window's, however long the call was), or all of them."""
        window = self.model.config.sliding_window
        return window if isinstance(window, int) and window > 0 else max(frames, 1)

    def _samples(self, history: Sequence[tuple[np.ndarray, FrameTokens]]) -> torch.Tensor:
        """(1, frames * 1920) input samples of ``history`` on the model's device."""
        samples = np.concatenate([frame for frame, _ in history])
        return torch.from_numpy(samples)[None].to(self.model.device, self.model.dtype)

    @torch.no_grad()
    def adopt(self, alone: DuplexStepper) -> int:
        """Take a free row for ``alone``'s row 0 (from ``rebuild``) and splice
        its state in: its caches, codec state and next column."""
        row = self.join()
        self._adopt_columns(row, alone)
        splice_row(self.cache, self.timeline, row, alone.cache, alone.timeline)
        return row

    def _adopt_columns(self, row: int, alone: DuplexStepper) -> None:
        """``row`` takes ``alone``'s row 0 as a tick leaves it outside the
        temporal cache: its step, next column, late user codes, codec state."""
        self.step[row] = alone.step[0]
        self.text_in[row] = alone.text_in[0]
        self.audio_in[row] = alone.audio_in[0]
        self.user_late[row] = alone.user_late[0]
        encoder, decoder = alone._eager_codec()
        self.encoder.adopt(row, encoder)
        self.decoder.adopt(row, decoder)

    def sample(self, row: int, sampling: Sampling) -> None:
        """How ``row`` picks its tokens from its next tick on (a joined row
        starts greedy)."""
        self.sampling[row] = sampling

    def leave(self, row: int) -> None:
        """Free the row; what it computes until reused is ignored."""
        self.live[row] = False

    @torch.no_grad()
    def tick(
        self,
        samples: dict[int, np.ndarray],
        forced: dict[int, FrameTokens] | None = None,
    ) -> dict[int, RowFrame]:
        """Advance every live row by one frame.

        ``samples`` holds each live row's newest ``frame_samples`` input
        samples (float, -1..1); ``forced`` the tokens a row must take instead
        of choosing them (teacher forcing: a prefill over logged frames).
        """
        forced = forced or {}
        self._check_inputs(samples, forced)
        user = self.encoder.encode(self._input_batch(samples))
        return self._advance(user, forced)

    @torch.no_grad()
    def prime_tick(self, frames: dict[int, PrimeFrame]) -> dict[int, RowFrame]:
        """Advance every live row by one frame of its system prompt: the
        user's codes are given (the rows' encoders are not run) and the
        model's column is forced. Every live row must be priming."""
        live = {row for row, is_live in enumerate(self.live) if is_live}
        if set(frames) != live:
            raise ValueError(f"a prime tick needs a frame for exactly the live rows {sorted(live)}")
        user = torch.full_like(self.audio_in, self.audio_start)
        for row, frame in frames.items():
            if len(frame.user) != self.num_codebooks:
                raise ValueError(f"row {row}: a prime frame's user codes are not one a codebook")
            user[row] = torch.tensor(frame.user, dtype=torch.long)
        forced = {row: frame.tokens for row, frame in frames.items()}
        self._check_forced(forced)
        return self._advance(user, forced)

    def _advance(self, user: torch.Tensor, forced: dict[int, FrameTokens]) -> dict[int, RowFrame]:
        """Everything of a tick after the user's codes are known."""
        for row, step in enumerate(self.step):
            if self.live[row] and step == 1:
                self.decoder.reset(row)  # a row's codec output starts at its frame 1
        user_column = torch.cat([user[:, :1], self.user_late], dim=1)
        self.user_late = user[:, 1:].clone()
        hidden, text_logits = self._temporal_step(user_column)
        noise = self._draw(text_logits.shape[-1])
        if noise is None:
            text = text_logits.argmax(dim=-1)
        else:
            text = choose(text_logits, noise.inverse_temperature, noise.text, TEXT_TOP_K)
        text = self._force_text(text, forced)
        audio = self._depth_step(hidden, text, forced, noise)
        frame_codes = torch.cat([self.audio_in[:, :1], audio[:, 1:]], dim=1)
        frame_codes = frame_codes.clamp(max=self.audio_start - 1)  # rows at step 0: ignored
        voice = self.decoder.decode(frame_codes).float().cpu().numpy()
        out = self._collect(text, audio, voice)
        self.text_in = text
        self.audio_in = audio
        return out

    def _draw(self, text_vocab: int) -> Draw | None:
        """This tick's noise: each sampling live row's, at its frame number."""
        sampling = [s if live else GREEDY for s, live in zip(self.sampling, self.live, strict=True)]
        return draw(
            sampling, self.step, text_vocab, self.num_codebooks, self.audio_vocab, self.model.device
        )

    def _check_inputs(self, samples: dict[int, np.ndarray], forced: dict[int, FrameTokens]) -> None:
        live = {row for row, is_live in enumerate(self.live) if is_live}
        if set(samples) != live:
            raise ValueError(f"a tick needs samples for exactly the live rows {sorted(live)}")
        for row, frame in samples.items():
            if frame.shape != (self.frame_samples,):
                raise ValueError(f"row {row}: expected {self.frame_samples} samples")
        self._check_forced(forced)

    def _check_forced(self, forced: dict[int, FrameTokens]) -> None:
        live = {row for row, is_live in enumerate(self.live) if is_live}
        for row, tokens in forced.items():
            if row not in live or len(tokens.audio) != self.num_codebooks:
                raise ValueError(f"row {row}: forced tokens for a row that is not live or short")

    def _input_batch(self, samples: dict[int, np.ndarray]) -> torch.Tensor:
        batch = np.zeros((self.rows, self.frame_samples), dtype=np.float32)
        for row, frame in samples.items():
            batch[row] = frame
        return torch.from_numpy(batch).to(self.model.device, self.model.dtype)

    def _temporal_step(self, user_column: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.model
        k = self.num_codebooks
        embeds = model.decoder.model.embed_tokens(self.text_in)
        for codebook in range(k):
            embeds = embeds + model.embed_tokens[codebook](self.audio_in[:, codebook])
            embeds = embeds + model.embed_tokens[k + codebook](user_column[:, codebook])
        mask, positions = self.timeline.step_inputs()
        out = model.decoder(
            inputs_embeds=embeds[:, None, :],
            attention_mask=mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
        )
        self.timeline.advance()
        return out.last_hidden_state, out.logits[:, -1, :]

    def _force_text(self, text: torch.Tensor, forced: dict[int, FrameTokens]) -> torch.Tensor:
        for row, tokens in forced.items():
            text[row] = tokens.text
        return text

    def _depth_step(
        self,
        hidden: torch.Tensor,
        text: torch.Tensor,
        forced: dict[int, FrameTokens],
        noise: Draw | None,
    ) -> torch.Tensor:
        """The frame's codebooks one by one, each fed the one before (or the forced one)."""
        codes = torch.zeros_like(self.audio_in)  # rows neither live nor forced: a valid code
        for row, tokens in forced.items():
            codes[row] = torch.tensor(tokens.audio, dtype=torch.long)
        if all(self.live[row] == (row in forced) for row in range(self.rows)):
            return codes  # a pure prefill tick: nothing to choose
        depth = self.model.depth_decoder
        cache = DynamicCache(config=depth.config)
        previous = text[:, None]
        for codebook in range(self.num_codebooks):
            logits = depth(
                input_ids=previous, last_hidden_state=hidden, cache=cache, use_cache=True
            ).logits[:, -1, :]
            if noise is None:
                chosen = logits.argmax(dim=-1)
            else:
                inverse, audio = noise.inverse_temperature, noise.audio[:, codebook]
                chosen = choose(logits, inverse, audio, AUDIO_TOP_K)
            for row in forced:
                chosen[row] = codes[row, codebook]
            codes[:, codebook] = chosen
            previous = chosen[:, None]
        return codes

    def _collect(
        self, text: torch.Tensor, audio: torch.Tensor, voice: np.ndarray
    ) -> dict[int, RowFrame]:
        out: dict[int, RowFrame] = {}
        texts = text.tolist()
        codes = audio.tolist()
        for row in range(self.rows):
            if not self.live[row]:
                continue
            step = self.step[row]
            samples = voice[row] if step > 0 else np.zeros(self.frame_samples, dtype=np.float32)
            out[row] = RowFrame(step, FrameTokens(texts[row], tuple(codes[row])), samples)
            self.step[row] = step + 1
        return out
