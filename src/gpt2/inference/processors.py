"""Logits processors: each decoding rule (a penalty, a ban, a bias, a minimum length, a grammar mask) is one small
callable `(token_ids, logits) -> logits`, and every decoder (`stream`, beam search, the server's engine) applies
the list `build_processors` makes from a `SamplingParams`. A new rule is a new processor, never a new parameter of
a decode loop (transformers' `LogitsProcessor` and vLLM's logits processors are the pattern; the signature is
transformers', so their processors drop in).

Notation: B = rows (sequences or beams), T = tokens so far (prompt, left padding included, + generated), V = vocab.

The rules and their meanings (transformers' GenerationConfig names and rules unless said otherwise):

- `logit_bias`: adds a fixed amount to chosen ids (OpenAI's);
- `repetition_penalty`: CTRL's rule, a logit of a token already present (prompt or continuation, never padding)
  is divided by the penalty when positive and multiplied by it when negative;
- `no_repeat_ngram_size`: bans the token that would complete an n-gram already present;
- `bad_words`: bans a token sequence (its last token, where the ones before it were just produced);
- `min_tokens`: bans the stop ids (end-of-text among them) until that many tokens are generated;
- `presence_penalty` / `frequency_penalty`: OpenAI's rule over the continuation only (not the prompt, as vLLM);
- a vocabulary limit: ids the tokenizer lacks (a padded vocabulary) are never drawn;
- `min_p`: drops tokens less than min_p times as probable as the best one at the sampling temperature
  (transformers' MinPLogitsWarper; last, so it sees every other rule's logits, and before top-k / top-p as in vLLM).

Order, as transformers applies its own: bias, repetition, n-grams, bad words, minimum length; then OpenAI's
penalties and the vocabulary limit. Temperature, top-k and top-p are the sampler's (gpt2.inference.sampling).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from gpt2.inference.sampling import SamplingParams
from gpt2.tokenizer.protocol import TextTokenizer

NEG_INF = float("-inf")


@runtime_checkable
class LogitsProcessor(Protocol):
    """One decoding rule: transformers' signature.

    token_ids: (B, T) long, every token of each row so far (prompt with its left padding, then the generated
    ones); logits: (B, V) float32, the next token's scores. Returns the (B, V) scores to use instead; it may write
    into `logits` (every caller passes a tensor it owns) and must not change `token_ids`.
    """

    def __call__(self, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor: ...


def apply_processors(
    processors: Sequence[LogitsProcessor], token_ids: torch.Tensor, logits: torch.Tensor
) -> torch.Tensor:
    """logits (B, V) after every processor in turn."""
    for processor in processors:
        logits = processor(token_ids, logits)
    return logits


def _real_tokens(token_ids: torch.Tensor, padding: torch.Tensor | None, filler: int) -> torch.Tensor:
    """token_ids (B, T) with each row's left padding (its first padding[b] columns) replaced by `filler`."""
    if padding is None:
        return token_ids
    columns = torch.arange(token_ids.size(1), device=token_ids.device)
    return token_ids.masked_fill(columns[None, :] < padding[:, None], filler)


# ------------------------------------------------------------------------------------------ the rules
@dataclass(frozen=True)
class LogitBias:
    """Adds bias[i] to the logit of id i (OpenAI's logit_bias); ids past the vocabulary are ignored."""

    bias: dict[int, float]

    def __call__(self, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        V = logits.size(-1)
        ids = [token for token in self.bias if token < V]
        if ids:
            index = torch.tensor(ids, device=logits.device)
            logits[:, index] += torch.tensor([self.bias[token] for token in ids], device=logits.device)
        return logits


@dataclass(frozen=True)
class RepetitionPenalty:
    """CTRL's repetition penalty as transformers applies it: every id present in the row (its left padding
    excluded) has its logit divided by `penalty` when positive, multiplied by it when negative.
    padding: (B,) left padding columns per row, or None."""

    penalty: float
    padding: torch.Tensor | None = None

    def __call__(self, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        V = logits.size(-1)
        present = torch.zeros(logits.size(0), V + 1, dtype=torch.bool, device=logits.device)  # column V: padding
        present.scatter_(1, _real_tokens(token_ids, self.padding, V), True)
        penalized = torch.where(logits < 0, logits * self.penalty, logits / self.penalty)
        return torch.where(present[:, :V], penalized, logits)


@dataclass(frozen=True)
class NoRepeatNGram:
    """Bans every token that would complete an n-gram (n = size) the row already holds (left padding excluded).

    Only n-grams whose first n - 1 tokens equal the row's last n - 1 tokens can be completed by the next token,
    so each window of n tokens is compared with that suffix and a matching window bans its last token."""

    size: int
    padding: torch.Tensor | None = None

    def __call__(self, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        T, V = token_ids.size(1), logits.size(-1)
        if T < self.size:
            return logits
        tokens = _real_tokens(token_ids, self.padding, V)  # padding becomes V: it never equals a real token
        suffix = tokens[:, T - self.size + 1 :]  # (B, n - 1)
        windows = tokens.unfold(1, self.size, 1)  # (B, T - n + 1, n)
        matches = (windows[..., :-1] == suffix[:, None, :]).all(dim=-1)  # (B, T - n + 1)
        banned = torch.zeros(logits.size(0), V + 1, dtype=torch.bool, device=logits.device)
        banned.scatter_(1, torch.where(matches, windows[..., -1], V), True)
        return logits.masked_fill(banned[:, :V], NEG_INF)


@dataclass(frozen=True)
class BadWords:
    """Bans token sequences (transformers' bad_words_ids): a one-token sequence always; a longer one's last token
    where the row ends with the tokens before it."""

    sequences: tuple[tuple[int, ...], ...]

    def __call__(self, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        V = logits.size(-1)
        banned = torch.zeros_like(logits, dtype=torch.bool)
        for sequence in self.sequences:
            *prefix, last = sequence
            if last >= V:
                continue
            if not prefix:
                banned[:, last] = True
            elif len(prefix) <= token_ids.size(1):
                expected = torch.tensor(prefix, device=token_ids.device)
                banned[:, last] |= (token_ids[:, -len(prefix) :] == expected).all(dim=1)
        return logits.masked_fill(banned, NEG_INF)


@dataclass(frozen=True)
class MinTokens:
    """Bans the stop ids (end-of-text among them) while fewer than `count` tokens follow the prompt's
    `prompt_length` columns (transformers' min_new_tokens)."""

    count: int
    prompt_length: int
    stop_ids: tuple[int, ...]

    def __call__(self, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if token_ids.size(1) - self.prompt_length < self.count:
            ids = [token for token in self.stop_ids if token < logits.size(-1)]
            logits[:, ids] = NEG_INF
        return logits


@dataclass(frozen=True)
class PresenceFrequencyPenalty:
    """OpenAI's penalties over the continuation (the columns after `prompt_length`): a token's logit falls by
    `presence` once it appears there and by `frequency` times the number of times it appears."""

    presence: float
    frequency: float
    prompt_length: int

    def __call__(self, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        generated = token_ids[:, self.prompt_length :]
        counts = torch.zeros_like(logits)
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=logits.dtype))
        return logits - self.frequency * counts - self.presence * (counts > 0).to(logits.dtype)


@dataclass(frozen=True)
class VocabLimit:
    """Ids >= limit are never drawn: a model whose vocabulary was padded beyond its tokenizer's."""

    limit: int

    def __call__(self, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        logits[:, self.limit :] = NEG_INF
        return logits


# ------------------------------------------------------------------------------------------ building
@dataclass(frozen=True)
class MinP:
    """Bans the tokens whose probability at `temperature` is below `min_p` times the row's largest (transformers'
    MinPLogitsWarper applied to logits / temperature; the sampler divides by the temperature afterwards, which
    keeps the banned tokens at -inf). The most probable token always stays."""

    min_p: float
    temperature: float

    def __call__(self, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)  # (B, V)
        threshold = self.min_p * probs.amax(dim=-1, keepdim=True)  # (B, 1)
        return logits.masked_fill(probs < threshold, NEG_INF)


def build_processors(
    params: SamplingParams,
    *,
    prompt_length: int,
    vocab_size: int,
    vocab_limit: int | None = None,
    padding: torch.Tensor | None = None,
) -> list[LogitsProcessor]:
    """The processors `params` asks for, in order (module docstring), for rows whose first `prompt_length`
    columns are the prompt (`padding`: (B,) left padding columns per row, or None).

    The stop ids min_tokens bans are params.stop_token_ids: callers that stop at end-of-text put it there (see
    `with_end_of_text`). Bad words must be token ids by now (`encode_bad_words` turns texts into ids).

    >>> params = SamplingParams(repetition_penalty=1.3, min_tokens=2, stop_token_ids=[0])
    >>> [type(p).__name__ for p in build_processors(params, prompt_length=3, vocab_size=10, vocab_limit=8)]
    ['RepetitionPenalty', 'MinTokens', 'VocabLimit']
    """
    processors: list[LogitsProcessor] = []
    if params.logit_bias:
        _check_ids("logit_bias", params.logit_bias, vocab_size)
        processors.append(LogitBias(dict(params.logit_bias)))
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenalty(params.repetition_penalty, padding))
    if params.no_repeat_ngram_size:
        processors.append(NoRepeatNGram(params.no_repeat_ngram_size, padding))
    if params.bad_words:
        texts = [word for word in params.bad_words if isinstance(word, str)]
        if texts:
            raise ValueError(f"bad_words holds texts {texts!r}: encode them first (encode_bad_words) or pass ids")
        sequences = tuple(word for word in params.bad_words if not isinstance(word, str))
        _check_ids("bad_words", [token for sequence in sequences for token in sequence], vocab_size)
        processors.append(BadWords(sequences))
    if params.min_tokens and params.stop_token_ids:
        processors.append(MinTokens(params.min_tokens, prompt_length, params.stop_token_ids))
    if params.presence_penalty or params.frequency_penalty:
        processors.append(PresenceFrequencyPenalty(params.presence_penalty, params.frequency_penalty, prompt_length))
    if vocab_limit is not None and vocab_limit < vocab_size:
        processors.append(VocabLimit(vocab_limit))
    if params.min_p > 0 and not params.greedy:  # greedy keeps the best token, which min_p always keeps
        processors.append(MinP(params.min_p, params.temperature))
    return processors


def _check_ids(name: str, ids: Iterable[int], vocab_size: int) -> None:
    bad = [token for token in ids if token >= vocab_size]
    if bad:
        raise ValueError(f"{name} holds {bad[0]}, which is not a token id in [0, {vocab_size})")


def encode_bad_words(params: SamplingParams, tokenizer: TextTokenizer) -> SamplingParams:
    """params with its bad-word texts as token id sequences: each text as it encodes and with a leading space
    (a word inside a sentence is a different token than at its start), as vLLM bans them."""
    if not any(isinstance(word, str) for word in params.bad_words):
        return params
    sequences: list[tuple[int, ...]] = []
    for word in params.bad_words:
        variants = [word] if not isinstance(word, str) else [tokenizer.encode(word), tokenizer.encode(" " + word)]
        for variant in variants:
            sequence = tuple(variant)
            if sequence and sequence not in sequences:
                sequences.append(sequence)
    return params.replace(bad_words=tuple(sequences))


def with_end_of_text(params: SamplingParams, tokenizer: TextTokenizer) -> SamplingParams:
    """params whose stop ids start with the tokenizer's end-of-text and whose bad words are ids: what the text
    paths (LLM, stream_text, the server) decode with."""
    params = encode_bad_words(params, tokenizer)
    if tokenizer.eot_token in params.stop_token_ids:
        return params
    return params.replace(stop_token_ids=(tokenizer.eot_token, *params.stop_token_ids))
