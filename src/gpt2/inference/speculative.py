"""Speculative decoding, exact: a cheap drafter proposes k tokens, the model verifies them in one forward.

Notation: V = vocabulary size, k = drafted tokens per step, n = committed tokens (prompt + generated).

Each step the drafter guesses the next k tokens d_1..d_k; one forward of the target over [last committed
token, d_1, ..., d_k] with its KV cache gives the target's k + 1 next-token distributions p_0..p_k at once
(decoding at batch 1 reads every weight once per forward, whatever k is: this is how speculation gets past the
memory-bandwidth limit of one token per weight read). Then, left to right:

- greedy: d_i is kept while it is the target's argmax; the first mismatch is replaced by the argmax, and when
  every draft is kept p_k's argmax comes for free. The output is plain greedy decoding's, token for token.
- sampling (Leviathan et al. 2023, Chen et al. 2023): d_i, drafted from q_i, is kept with probability
  min(1, p_i(d_i) / q_i(d_i)); the first rejected one is replaced by a draw from norm(max(0, p_i - q_i)); after
  k kept drafts one more token is drawn from p_k. Every token is then distributed exactly as the target's p.
  p and q are the *filtered* distributions of `gpt2.inference.sampling` (temperature, top-k, top-p), so the
  output follows what plain sampling with the same parameters draws from.

Rejected positions are rolled back by shortening the cache (`KVCache.length`): the keys of rejected drafts are
simply overwritten by the next forward.

Drafters (the `Drafter` protocol):

- `PromptLookup`: n-gram lookup in the text so far (prompt lookup decoding, as transformers'
  `prompt_lookup_num_tokens`): the most recent earlier occurrence of the last 1..max_ngram tokens, and the k
  tokens that followed it. No model, so its q is a point mass (a draft is kept with probability p_i(d_i)).
  Wins when the continuation repeats the context: code, edits, extraction, quoting.
- `DraftModel`: a smaller GPT-2 with the same tokenizer drafting k tokens autoregressively with its own cache.

Batch 1 only. Past the context window both models slide as `gpt2.inference.generation.stream` does (re-prefill
the last block_size - slide_by tokens), but at the points where the next verification no longer fits, so a
continuation longer than the window is not token-for-token plain decoding's there; within it, it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from gpt2.config import is_integer
from gpt2.cpu.decoder import NativeDecoder, native_decoder
from gpt2.inference.checks import check_prompt_ids, check_stop_ids
from gpt2.inference.generation import DEFAULT_SLIDE_FRACTION, prompt_ids, text_params, text_pieces
from gpt2.inference.processors import build_processors
from gpt2.inference.prompt import DecodeOptions
from gpt2.inference.sampling import SamplingParams, draw, filtered_probs, is_greedy, sample_next_token
from gpt2.tokenizer.protocol import TextTokenizer

if TYPE_CHECKING:
    from gpt2.model import GPT


NATIVE_SPAN = 16
"""Spans of at most this many new tokens (verifications, a draft catching up) run in the native decoder, which reads
the weights once for them all (for an 88M float32 target, verifying 9 tokens costs about two one-token steps, less
than the same span through the model; `gpt2 bench decode` re-measures it); longer ones (a prompt) run the model's
prefill."""


# ------------------------------------------------------------------------------------------ distributions
@dataclass(frozen=True)
class Sampler:
    """The sampling settings of a speculative generation; `probs` is `gpt2.inference.sampling.filtered_probs`,
    the distribution `sample_next_token` draws from, and `greedy` its threshold, so drafts are accepted by the
    one rule every draw follows."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) -> the distribution sample_next_token draws from (..., V) float32."""
        return filtered_probs(logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


def speculates(params: SamplingParams, *, rules: bool, logprobs: bool) -> bool:
    """Whether speculation serves a sequence, the one rule of the offline API and the server's engine: greedy, with
    no rules (penalties, bans, grammars, beams) and no log-probabilities. Greedy speculation commits exactly the
    tokens plain greedy decoding draws, so such a sequence's tokens are the same whether it speculates or not,
    alone or among others. A sampled sequence never speculates: its kept drafts are distributed as plain sampling's
    draws but are not the same draws, so its text would depend on whether it ran alone."""
    return params.greedy and params.num_beams == 1 and not rules and not logprobs


# ------------------------------------------------------------------------------------------ cached model
class _CachedModel:
    """A model, its KV cache and its window over the token buffer: the cache holds the keys of columns
    [start, start + cache.length) of `tokens`."""

    def __init__(self, model: GPT, *, slide_by: int | None, native: bool) -> None:
        self.model = model
        block_size = model.config.block_size
        self.slide_by = block_size // DEFAULT_SLIDE_FRACTION if slide_by is None else slide_by
        if not is_integer(self.slide_by) or not 0 <= self.slide_by < block_size:
            raise ValueError(f"slide_by must be an integer in [0, block_size={block_size}), got {slide_by!r}")
        self.cache = model.new_kv_cache(1)
        self.start = 0
        self.decoder: NativeDecoder | None = native_decoder(model) if native else None

    @property
    def max_draft(self) -> int:
        """Drafts per verification that always fit beside the window kept by a slide."""
        return max(0, min(self.cache.max_len - max(self.slide_by, 1), self.cache.max_len // 2) - 1)

    def logits(self, tokens: torch.Tensor, end: int, count: int) -> torch.Tensor:
        """Feed the columns of tokens (N,) up to `end` that the cache lacks; the logits (count, V) after each of
        the last `count` columns [end - count, end)."""
        if end - self.start > self.cache.max_len:
            # Full window: keep the last block_size - slide_by columns at positions [0, W) (generation.py).
            self.start = end - max(self.cache.max_len - self.slide_by, count)
            self.cache.reset()
        fresh = tokens[self.start + self.cache.length : end]  # (F,), F >= count
        assert fresh.numel() >= count >= 1, "the cache holds columns whose logits are asked for"
        if self.decoder is not None and fresh.numel() <= NATIVE_SPAN and self.decoder.takes(fresh.numel()):
            return self.decoder.extend(fresh, self.cache)[-count:]  # a verification or a catch-up: a few rows
        hidden = self.model.hidden_states(fresh.view(1, -1), kv_cache=self.cache, validate=False)  # (1, F, C)
        return self.model.lm_head(hidden[0, -count:])  # (count, V)

    def keep(self, columns: int) -> None:
        """Forget every cached column from `columns` on (rejected drafts)."""
        self.cache.length = max(0, min(self.cache.length, columns - self.start))

    def verify(self, tokens: torch.Tensor, n: int, k: int) -> torch.Tensor:
        return self.logits(tokens, n + k, k + 1)

    def reject(self, count: int) -> None:
        self.cache.length = max(0, self.cache.length - count)


class Target(Protocol):
    """The model that verifies drafts, with its cache (`_CachedModel` offline, the server's batch row)."""

    def verify(self, tokens: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """Feed the drafts tokens[n : n + k] after the committed tokens[:n] (the cache holds all but the last
        committed one); the logits (k + 1, V) after tokens[n - 1], ..., tokens[n + k - 1]."""
        ...

    def reject(self, count: int) -> None:
        """Forget the last `count` tokens fed (rejected drafts)."""
        ...


# ------------------------------------------------------------------------------------------ drafters
class Drafter(Protocol):
    """Proposes the next tokens. One drafter serves one generation at a time (`start` begins a new one)."""

    def start(self, *, slide_by: int | None, native: bool) -> None:
        """A new sequence begins: forget any state of the previous one."""
        ...

    def max_draft(self) -> int:
        """The most tokens `propose` can be asked for."""
        ...

    def propose(
        self, tokens: torch.Tensor, n: int, k: int, sampler: Sampler, vocab: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to k tokens (k',) long continuing tokens[:n], and the distributions (k', vocab) they were drawn
        from (None: each draft is certain, a point mass). tokens (N,) may be written at [n, n + k)."""
        ...

    def accept(self, columns: int) -> None:
        """tokens[:columns] are settled: any state past them is stale."""
        ...


@dataclass
class PromptLookup:
    """Draft by n-gram lookup: find the most recent earlier occurrence of the last `max_ngram` (then fewer,
    down to `min_ngram`) tokens and propose the tokens that followed it.

    How many: with `adaptive` (the default), a length that starts at 1 and grows by 2 after a step whose drafts
    were all kept, shrinks by 1 after one with a rejection, never past `num_tokens` (transformers' "heuristic"
    schedule for its assistant model): each drafted token costs a row of the verification, so long drafts pay only
    while the text is being copied. Otherwise always `num_tokens`.

    >>> tokens = torch.tensor([5, 6, 7, 8, 9, 5, 6])
    >>> PromptLookup(num_tokens=2, adaptive=False).propose(tokens, 7, 2, Sampler(0), 10, None)[0].tolist()
    [7, 8]
    """

    num_tokens: int = 10
    """k: the most tokens drafted per step (transformers' prompt_lookup_num_tokens defaults to 10)."""
    max_ngram: int = 3
    min_ngram: int = 1
    adaptive: bool = True
    _length: int = field(default=1, init=False, repr=False)  # the adaptive draft length
    _proposed: tuple[int, int] = field(default=(0, 0), init=False, repr=False)  # (n, drafts) of the last proposal

    def __post_init__(self) -> None:
        if not is_integer(self.num_tokens) or self.num_tokens < 1:
            raise ValueError(f"prompt lookup num_tokens must be an integer >= 1, got {self.num_tokens!r}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram} and {self.max_ngram}")

    def start(self, *, slide_by: int | None, native: bool) -> None:
        self._length, self._proposed = 1, (0, 0)

    def max_draft(self) -> int:
        return self.num_tokens

    def propose(
        self, tokens: torch.Tensor, n: int, k: int, sampler: Sampler, vocab: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.adaptive:
            k = min(k, self._length)
        history = tokens[:n]
        drafts = history[:0]
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            windows = history[:-1].unfold(0, size, 1)  # (n - size, size): every earlier n-gram
            hits = (windows == history[n - size :]).all(dim=1).nonzero()
            if hits.numel():
                follow = int(hits[-1]) + size  # the most recent match, and the column after it
                drafts = history[follow : follow + k]
                break
        self._proposed = (n, drafts.numel())
        return drafts.clone(), None

    def accept(self, columns: int) -> None:
        n, drafted = self._proposed
        if self.adaptive and drafted:
            all_kept = columns - n == drafted
            self._length = min(self.num_tokens, self._length + 2) if all_kept else max(1, self._length - 1)


@dataclass
class DraftModel:
    """Draft with a smaller model sharing the target's tokenizer: k tokens sampled autoregressively from its
    filtered distributions, with its own KV cache (rolled back with the target's)."""

    model: GPT
    num_tokens: int = 8
    """k: the most tokens drafted per step (each costs a draft step; a rejected one is wasted)."""
    confidence: float = 0.4
    """Stop drafting early after a token the draft gave less than this probability (transformers'
    assistant_confidence_threshold, same default): an unsure draft is likely rejected, and each drafted token
    costs a draft step and a row of the verification. 0 drafts num_tokens every step."""
    _state: _CachedModel | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not is_integer(self.num_tokens) or self.num_tokens < 1:
            raise ValueError(f"draft num_tokens must be an integer >= 1, got {self.num_tokens!r}")
        if not 0 <= self.confidence < 1:
            raise ValueError(f"draft confidence must be in [0, 1), got {self.confidence!r}")

    def start(self, *, slide_by: int | None, native: bool) -> None:
        block_size = self.model.config.block_size
        self._state = _CachedModel(self.model, slide_by=min(slide_by or 0, block_size - 1) or None, native=native)

    def max_draft(self) -> int:
        assert self._state is not None, "call start() first"
        return min(self.num_tokens, self._state.max_draft)

    def propose(
        self, tokens: torch.Tensor, n: int, k: int, sampler: Sampler, vocab: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        assert self._state is not None, "call start() first"
        dists = []
        drafted = 0
        while drafted < k:
            logits = self._state.logits(tokens, n + drafted, 1)[-1, :vocab]  # (vocab,)
            if sampler.greedy:  # greedy drafts are certain: no distribution needed
                token = int(sample_next_token(logits.view(1, -1), temperature=0.0)[0])
                probability = float(torch.softmax(logits.float(), dim=-1)[token]) if self.confidence else 1.0
            else:
                dists.append(sampler.probs(logits))
                token = int(draw(dists[-1].view(1, -1), generator)[0])
                probability = float(dists[-1][token])
            tokens[n + drafted] = token
            drafted += 1
            if probability < self.confidence:
                break
        return tokens[n : n + drafted].clone(), torch.stack(dists) if dists else None

    def accept(self, columns: int) -> None:
        assert self._state is not None, "call start() first"
        self._state.keep(columns)


# ------------------------------------------------------------------------------------------ decoding
@dataclass
class SpeculationStats:
    """Counts of one speculative generation: acceptance rate = accepted / drafted."""

    verifications: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@torch.no_grad()
def speculative_stream(
    model: GPT,
    prompt: Sequence[int] | torch.Tensor,
    params: SamplingParams,
    drafter: Drafter,
    *,
    generator: torch.Generator | None = None,
    options: DecodeOptions | None = None,
    stats: SpeculationStats | None = None,
) -> Iterator[int]:
    """Yield the continuation of one prompt (token ids) token by token, each token verified by `model`.

    params: what to draw, as in `gpt2.inference.generation.stream` (temperature, top_k, top_p, seed or
    `generator`, stop_token_ids, max_tokens; no decoding rules: those sequences decode with `stream`); the tokens
    are those plain decoding gives (greedy) or distributed as they are (sampling), module docstring. Ends after a
    stop id (yielded) or params.max_tokens tokens. options: DecodeOptions' vocab_limit (never draw ids >= this),
    slide_by, and native (False: never run the verifications and the draft model's steps, spans of up to
    NATIVE_SPAN tokens, in the native decoder; otherwise where it can). stats: filled in with the counts of
    drafted and accepted tokens.

    >>> from gpt2 import GPT, GPTConfig
    >>> from gpt2.inference import stream
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=257)).eval()
    >>> prompt, params = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], SamplingParams(max_tokens=20, temperature=0)
    >>> tokens = list(speculative_stream(model, prompt, params, PromptLookup()))
    >>> plain = [int(t[0]) for t in stream(model, torch.tensor([prompt]), params)]
    >>> tokens == plain  # greedy: exactly plain decoding's tokens
    True
    """
    options = options or DecodeOptions()
    ids, vocab = _check_request(model, prompt, params, drafter, options)
    if params.seed is not None and generator is not None:
        raise ValueError("pass either seed or generator, not both (a seed makes a fresh generator)")
    device = model.transformer.wte.weight.device
    if params.seed is not None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    stats = stats if stats is not None else SpeculationStats()
    stops = set(check_stop_ids(params.stop_token_ids, model.config.vocab_size))
    sampler = Sampler(params.temperature, params.top_k, params.top_p)

    native = options.native is not False
    target = _CachedModel(model, slide_by=options.slide_by, native=native)
    drafter.start(slide_by=options.slide_by, native=native)
    max_draft = min(target.max_draft, drafter.max_draft())
    tokens = torch.zeros(len(ids) + params.max_tokens + max_draft + 1, dtype=torch.long, device=device)
    n = len(ids)
    tokens[:n] = torch.tensor(ids, dtype=torch.long)
    speculator = Speculator(target, drafter, stats)
    while n - len(ids) < params.max_tokens:
        k = draft_length(max_draft, params.max_tokens - (n - len(ids)))
        for token in speculator.step(tokens, n, k, sampler, vocab, generator):
            tokens[n] = token
            n += 1
            stats.generated += 1
            yield token
            if token in stops:
                return


def _check_request(
    model: GPT, prompt: Sequence[int] | torch.Tensor, params: SamplingParams, drafter: Drafter, options: DecodeOptions
) -> tuple[list[int], int]:
    """speculative_stream's input checked: the prompt's ids and the vocabulary drafts come from."""
    if options.truncate or options.compile or options.pad_token_id is not None or options.stop_sequences:
        raise ValueError("speculative decoding takes DecodeOptions' vocab_limit, slide_by and native only")
    if params.num_beams > 1 or build_processors(params, prompt_length=0, vocab_size=model.config.vocab_size):
        raise ValueError("speculative decoding draws without decoding rules or beams: decode those with stream")
    if params.regex is not None or params.json_schema is not None:
        raise ValueError("speculative decoding draws without a grammar: decode structured output with stream_text")
    config = model.config
    limit = options.vocab_limit
    vocab = config.vocab_size if limit is None else min(limit, config.vocab_size)
    raw = prompt.view(-1).tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
    ids = check_prompt_ids(raw, vocab, config.block_size)
    if isinstance(drafter, DraftModel) and drafter.model.config.vocab_size < vocab:
        raise ValueError(
            f"the draft model has {drafter.model.config.vocab_size} tokens, the target {vocab}: a draft model "
            "must share the target's tokenizer"
        )
    return ids, vocab


def draft_length(max_draft: int, remaining: int) -> int:
    """How many tokens a step may draft: at most `max_draft` (what the drafter and the room left in the target's
    context allow) and never past the budget of `remaining` tokens, as a step's last token is the target's own."""
    return max(0, min(max_draft, remaining - 1))


@dataclass
class Speculator:
    """A drafter and the target that verifies its drafts, with the counts of their steps: the one speculative step
    of the offline stream and of the server's engine."""

    target: Target
    drafter: Drafter
    stats: SpeculationStats = field(default_factory=SpeculationStats)

    def step(
        self, tokens: torch.Tensor, n: int, k: int, sampler: Sampler, vocab: int, generator: torch.Generator | None
    ) -> list[int]:
        """Up to k drafts continuing tokens[:n] (tokens (N,) has room for them at [n, n + k)), one verification by
        the target, the rejected drafts rolled back (target and drafter), and the tokens the step commits: the kept
        drafts, then the target's own next token (`verify_drafts`)."""
        drafter = self.drafter
        drafts, q = drafter.propose(tokens, n, k, sampler, vocab, generator) if k > 0 else (tokens[:0], None)
        k = drafts.numel()
        tokens[n : n + k] = drafts
        logits = self.target.verify(tokens, n, k)[:, :vocab]  # (k + 1, vocab): p_0 .. p_k
        accepted, new = verify_drafts(logits.float(), drafts, q, sampler, generator)
        self.target.reject(k - accepted)
        drafter.accept(n + accepted)
        self.stats.verifications += 1
        self.stats.drafted += k
        self.stats.accepted += accepted
        return [*drafts[:accepted].tolist(), new]


def verify_drafts(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    sampler: Sampler,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """The number of drafts kept and the token that follows them, from the target's logits (k + 1, V) after
    each prefix, the drafts (k,) and their distributions q (k, V) (None: point masses): the rule of the module
    docstring (greedy: kept while they are the argmax; sampling: Leviathan / Chen)."""
    k = drafts.numel()
    if sampler.greedy:
        choice = sample_next_token(logits, temperature=0.0)  # (k + 1,) the argmax, as every greedy draw
        mismatch = (choice[:k] != drafts).nonzero()
        accepted = int(mismatch[0]) if mismatch.numel() else k
        return accepted, int(choice[accepted])
    p = sampler.probs(logits)  # (k + 1, V)
    uniforms = torch.rand(k, generator=generator, device=p.device)
    for i in range(k):
        token = int(drafts[i])
        q_token = 1.0 if q is None else float(q[i, token])
        if float(uniforms[i]) * q_token < float(p[i, token]):  # u < p / q, kept with probability min(1, p / q)
            continue
        residual = (p[i] - (F.one_hot(drafts[i], p.size(-1)).float() if q is None else q[i])).clamp(min=0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: any rejection was rounding; draw from p
            residual = p[i]
        return i, int(draw(residual.view(1, -1), generator)[0])
    return k, int(draw(p[k].view(1, -1), generator)[0])


# ------------------------------------------------------------------------------------------ text
def speculative_text(
    model: GPT,
    tokenizer: TextTokenizer,
    prompt: str | Sequence[int],
    params: SamplingParams,
    drafter: Drafter,
    *,
    slide_by: int | None = None,
    stats: SpeculationStats | None = None,
) -> Iterator[str]:
    """`gpt2.inference.generation.stream_text` with speculative decoding: the same text pieces, stops and end of
    text, each token verified by `model` (greedy: the same text as stream_text's within the context window)."""
    ids = prompt_ids(model, tokenizer, prompt)
    params, stop_ids = text_params(model, tokenizer, params)
    options = DecodeOptions(vocab_limit=len(tokenizer), slide_by=slide_by)
    tokens = speculative_stream(model, ids, params, drafter, options=options, stats=stats)
    yield from text_pieces(tokenizer, tokens, stop_ids, params.stop)  # the same text layer as stream_text
