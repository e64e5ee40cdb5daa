"""Sampling: the one parameters dataclass (OpenAI's names) shared by the Python API, `gpt2 sample` and the
server, and the per-step draw from next-token logits (temperature, then top-k, then top-p, then one draw).

Both filters keep ties together (see `filter_top_k`, `filter_top_p`), so the kept set never depends on how a
sort orders equal values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F

from gpt2.config import is_finite_number, is_integer

# top-p counts a cumulative mass within this of p as having reached p: probabilities summed in float32 are
# off by ~1e-7, and a mass of exactly p must not pull in the next token because of it.
TOP_P_TOLERANCE = 1e-6
# softmax(logits / t) is one-hot (up to float32 rounding) long before t gets this small, and dividing float32
# logits by a smaller t overflows to inf: below it the draw is greedy (argmax). Every path (LLM, the server's
# engine, beam search's scores) reads this one threshold.
GREEDY_BELOW_TEMPERATURE = 1e-5
PENALTY_RANGE = 2.0  # presence and frequency penalties lie in [-2, 2], as in OpenAI's API
LOGIT_BIAS_RANGE = 100.0  # a logit bias lies in [-100, 100], as in OpenAI's API
EarlyStopping = bool | Literal["never"]


@dataclass(frozen=True)
class SamplingParams:
    """How to continue a prompt, with the OpenAI API's names (and transformers' GenerationConfig names for what
    OpenAI lacks); validated once, at construction.

    >>> SamplingParams(max_tokens=20, temperature=0).greedy
    True
    >>> SamplingParams(top_p=1.5)
    Traceback (most recent call last):
    ...
    ValueError: top_p must be in (0, 1], got 1.5; use 1.0 to disable nucleus filtering
    """

    max_tokens: int = 16
    """New tokens at most (OpenAI's default is 16). The text ends earlier at end-of-text or a stop."""
    temperature: float = 1.0
    """Softmax temperature; 0 (or anything below GREEDY_BELOW_TEMPERATURE = 1e-5) is greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: draw from the smallest set of tokens whose probability reaches top_p (1.0: all)."""
    top_k: int | None = None
    """Draw from the k most likely tokens only (an extension of the OpenAI API, as in vLLM)."""
    stop: tuple[str, ...] = ()
    """Texts that end the continuation; the stop text itself is not returned."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the continuation besides end-of-text (not returned either)."""
    seed: int | None = None
    """Makes the draws reproducible: the same seed gives the same text."""
    n: int = 1
    """Continuations per prompt (transformers' num_return_sequences); the i-th uses seed + i when a seed is
    given. With beam search: the n best beams (n <= num_beams)."""
    repetition_penalty: float = 1.0
    """CTRL's rule as transformers applies it: a token already in the prompt or the continuation has its logit
    divided by this when positive, multiplied when negative (> 1 discourages repeats; 1.0: off)."""
    no_repeat_ngram_size: int = 0
    """Never produce an n-gram of this size twice (prompt included), as transformers does (0: off)."""
    min_tokens: int = 0
    """End-of-text and the stop token ids are banned until this many tokens are generated (min_new_tokens)."""
    bad_words: tuple[str | tuple[int, ...], ...] = ()
    """Never produced: texts (banned as they encode, and with a leading space, as vLLM does) or token id
    sequences (transformers' bad_words_ids: the last id is banned where the ones before it were just produced)."""
    logit_bias: Mapping[int, float] = field(default_factory=dict, hash=False)
    """Added to the logits of these token ids before sampling, in [-100, 100] (OpenAI's logit_bias)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of a token once it appears in the continuation, in [-2, 2] (OpenAI's rule)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per appearance in the continuation, in [-2, 2] (OpenAI's rule)."""
    num_beams: int = 1
    """Beam search with this many beams (1: off). Deterministic: needs temperature 0."""
    length_penalty: float = 1.0
    """Beam search: a finished beam scores sum(log p) / length ** length_penalty (transformers' rule)."""
    early_stopping: EarlyStopping = False
    """Beam search: True stops once num_beams beams have finished; False stops when no running beam can beat
    them (transformers' heuristic); "never" runs the exact check (transformers' meanings)."""

    regex: str | None = None
    """Structured output: the continuation matches this regular expression (gpt2.inference.structured)."""
    json_schema: Mapping[str, Any] | str | None = field(default=None, hash=False)
    """Structured output: the continuation is JSON valid under this schema, a dict or its JSON text
    ({"type": "object"}: any JSON object, OpenAI's json_object)."""
    min_p: float = 0.0
    """Draw only tokens at least min_p times as probable as the most probable one, after temperature, in [0, 1]
    (transformers' MinPLogitsWarper, vLLM's and llama.cpp's min_p; 0: off). Applied before top-k and top-p, as
    vLLM applies it."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, Sequence):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.stop_token_ids, Sequence):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.bad_words, str):
            object.__setattr__(self, "bad_words", (self.bad_words,))
        elif isinstance(self.bad_words, Sequence):
            words = tuple(word if isinstance(word, str) else tuple(word) for word in self.bad_words)
            object.__setattr__(self, "bad_words", words)
        if isinstance(self.logit_bias, Mapping):
            object.__setattr__(self, "logit_bias", dict(self.logit_bias))
        if not is_integer(self.max_tokens) or self.max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        if not is_finite_number(self.temperature) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if not is_finite_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}; use 1.0 to disable nucleus filtering")
        if self.top_k is not None and (not is_integer(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1, got {self.top_k!r}; use None to disable top-k filtering")
        if not is_finite_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be a number in [0, 1], got {self.min_p!r}; use 0 to disable it")
        if not all(isinstance(text, str) and text for text in self.stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        if not all(is_integer(token) and token >= 0 for token in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids (integers >= 0), got {self.stop_token_ids!r}")
        if self.seed is not None and not is_integer(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not is_integer(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        self._check_rules()
        self._check_beams()
        if self.regex is not None or self.json_schema is not None:
            from gpt2.inference.structured import check_structured  # its form; the grammar is checked when compiled

            check_structured(self.regex, self.json_schema)

    def _check_rules(self) -> None:
        if not is_finite_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be a number > 0 (1.0: off), got {self.repetition_penalty!r}")
        if not is_integer(self.no_repeat_ngram_size) or self.no_repeat_ngram_size < 0:
            raise ValueError(
                f"no_repeat_ngram_size must be an integer >= 0 (0: off), got {self.no_repeat_ngram_size!r}"
            )
        if not is_integer(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}"
            )
        for word in self.bad_words:
            if isinstance(word, str) and word:
                continue
            if not isinstance(word, tuple) or not word or not all(is_integer(token) and token >= 0 for token in word):
                raise ValueError(f"bad_words must hold non-empty texts or non-empty lists of token ids, got {word!r}")
        if not isinstance(self.logit_bias, Mapping):
            raise ValueError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
        for token, bias in self.logit_bias.items():
            if not is_integer(token) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not is_finite_number(bias) or not -LOGIT_BIAS_RANGE <= bias <= LOGIT_BIAS_RANGE:
                raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {bias!r} for token {token}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not is_finite_number(value) or not -PENALTY_RANGE <= value <= PENALTY_RANGE:
                raise ValueError(f"{name} must be a number in [-2, 2], got {value!r}")

    def _check_beams(self) -> None:
        if not is_integer(self.num_beams) or self.num_beams < 1:
            raise ValueError(f"num_beams must be an integer >= 1 (1: no beam search), got {self.num_beams!r}")
        if not is_finite_number(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty!r}")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        if self.num_beams > 1 and not self.greedy:
            raise ValueError(
                f"num_beams={self.num_beams} is beam search, which is deterministic: pass temperature=0 "
                f"(--temperature 0; got {self.temperature!r})"
            )
        if self.num_beams > 1 and self.n > self.num_beams:
            raise ValueError(f"n={self.n} beams asked for but num_beams={self.num_beams}; raise num_beams or lower n")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def for_sample(self, index: int) -> SamplingParams:
        """The parameters of the index-th of n continuations: seed + index, so they differ and are reproducible."""
        return self if self.seed is None or index == 0 else self.replace(seed=self.seed + index)


# ------------------------------------------------------------------------------------------ sampling
def filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Logits (..., V) with every token below the k-th largest logit set to -inf.

    Ties: tokens equal to the k-th largest value are all kept, so more than k may survive when values tie
    (which ones would otherwise depend on the sort). top_k >= V keeps everything.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}; use None to disable top-k filtering")
    if top_k >= logits.size(-1):
        return logits
    kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits (..., V) restricted to the nucleus: the smallest set of most probable tokens whose probability
    mass reaches top_p; the rest become -inf.

    Sorted by probability, a token is in the set when the mass of the tokens before it is still below top_p
    (so the most probable token is always kept). Ties: a token as probable as the least probable member is
    kept too, so the result does not depend on how the sort orders equal probabilities. top_p == 1 keeps all.
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}; use 1.0 (or None) to disable nucleus filtering")
    if top_p == 1.0:
        return logits
    probs = F.softmax(logits.float(), dim=-1)
    sorted_probs, _ = torch.sort(probs, dim=-1, descending=True)  # (..., V)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    in_nucleus = mass_before < top_p - TOP_P_TOLERANCE
    in_nucleus[..., 0] = True
    # the smallest probability inside the nucleus; everything at least that probable stays (ties)
    threshold = sorted_probs.masked_fill(~in_nucleus, float("inf")).amin(dim=-1, keepdim=True)  # (..., 1)
    return logits.masked_fill(probs < threshold, float("-inf"))


Generators = torch.Generator | Sequence[torch.Generator] | None


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: Generators = None,
) -> torch.Tensor:
    """One token per row from next-token logits (B, V) -> (B,) long, always an id in [0, V).

    temperature below GREEDY_BELOW_TEMPERATURE is greedy (argmax, first index on ties); otherwise
    softmax(logits / temperature) restricted by top-k then top-p, drawn with `generator`: one for the batch, one
    per row (row i then draws exactly what it would draw alone with generators[i]), or None (torch's global one).
    Logits may hold inf or huge values: NaN counts as -inf, +inf tokens share the draw; a row whose every logit
    is -inf (everything banned) is an error.

    >>> sample_next_token(torch.tensor([[0.0, 3.0, float("inf")]]), temperature=1e-45).tolist()
    [2]
    """
    logits = logits.float()
    # The common cases first, each one pass over the vocabulary and one device sync: greedy with a finite maximum
    # in every row (NaN propagates into the maximum, +inf is one), top-k with finite candidates.
    if temperature < GREEDY_BELOW_TEMPERATURE:
        top, best_ids = logits.max(dim=-1)  # the first index of the maximum, as argmax
        if bool(top.isfinite().all()):
            return best_ids
    elif top_k is not None and 1 <= top_k < logits.size(-1):  # a bad top_k gets filter_top_k's error below
        drawn = _draw_among_top_k(logits, temperature, top_k, top_p, generator)
        if drawn is not None:
            return drawn
    if temperature < GREEDY_BELOW_TEMPERATURE:
        return _resolved(logits).argmax(dim=-1)
    return draw(filtered_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p), generator)


def is_greedy(temperature: float) -> bool:
    """Whether a draw at this temperature is greedy (argmax): below GREEDY_BELOW_TEMPERATURE."""
    return temperature < GREEDY_BELOW_TEMPERATURE


def filtered_probs(
    logits: torch.Tensor, *, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """The distribution `sample_next_token` draws from at a temperature >= GREEDY_BELOW_TEMPERATURE: logits
    (..., V) -> softmax((logits - max) / temperature) after top-k then top-p, (..., V) float32. Speculative
    decoding accepts drafts against these same probabilities. Special values as `sample_next_token` treats them.
    """
    if is_greedy(temperature):
        raise ValueError(
            f"temperature {temperature!r} is greedy (below {GREEDY_BELOW_TEMPERATURE}): take the argmax instead"
        )
    shape = logits.shape
    logits = _resolved(logits.float().reshape(-1, shape[-1]))  # (N, V)
    # Shifted so the best logit is 0: dividing by a small temperature then only pushes the others towards -inf
    # (never +inf or NaN), and at least one token keeps probability 1 before normalization.
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        logits = filter_top_k(logits, top_k)
    if top_p is not None:
        logits = filter_top_p(logits, top_p)
    return F.softmax(logits, dim=-1).view(shape)


def _resolved(logits: torch.Tensor) -> torch.Tensor:
    """Logits (B, V) float32 ready to draw from: unchanged when all finite (a finite sum means every logit is
    finite: NaN and +-inf carry into it, so does an overflow of huge values, which then takes the careful path)."""
    return logits if bool(logits.sum().isfinite()) else _special_values_resolved(logits)


def _draw_among_top_k(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float | None, generator: Generators
) -> torch.Tensor | None:
    """What the full computation of `sample_next_token` draws from logits (B, V) with 1 <= top_k < V, computed
    over the k candidates alone (B, k): one pass over the vocabulary (top-k) instead of ten (V = 50257: about half
    the time with top-k alone, a seventh with top-p 0.9; benchmarks/inference/sampling.py). The candidates keep the
    vocabulary's order, so the inverse CDF walks them as it walks the whole row (where every other token has
    probability 0), with the same one uniform number per row: the same token, up to the float rounding of the
    softmax's sum. None when a row's candidates are not all finite, or it has ties at the k-th value reaching past k
    (the full computation keeps them all); with a generator per row, such a row makes every row draw alone instead,
    so that each draws what it draws alone (the server's engine samples its rows together)."""
    values, ids = torch.topk(logits, top_k + 1, dim=-1)  # (B, k + 1), largest first (NaN first too)
    # NaN or +inf on top: the careful path resolves them. A (k + 1)-th tied with the k-th: the full computation
    # keeps both (-inf candidates always tie so).
    if not bool(values[:, 0].isfinite().all()) or bool((values[:, -1] == values[:, -2]).any()):
        if generator is None or isinstance(generator, torch.Generator) or len(generator) == 1:
            return None
        alone = [
            sample_next_token(logits[row : row + 1], temperature=temperature, top_k=top_k, top_p=top_p, generator=one)
            for row, one in enumerate(generator)
        ]
        return torch.cat(alone)
    ids, order = ids[:, :-1].sort(dim=-1)  # the candidates in vocabulary order
    scaled = (values.gather(-1, order) - values[:, :1]) / temperature  # as the full computation scales them
    if top_p is not None:
        scaled = filter_top_p(scaled, top_p)
    chosen = draw(F.softmax(scaled, dim=-1), generator)  # (B,) an index among the candidates
    return ids.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)


def _special_values_resolved(logits: torch.Tensor) -> torch.Tensor:
    """Logits (B, V) holding NaN, +-inf or huge values -> what sampling draws from: NaN counts as -inf; a row
    holding +inf keeps only its +inf tokens, sharing the draw (score 0); a row with nothing left is an error, which
    names NaN as its cause when the row holds one (the model's activations overflowed, not the rules)."""
    not_a_number = logits.isnan().any(dim=-1)  # (B,)
    logits = logits.nan_to_num(nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    infinite = torch.isposinf(logits)  # (B, V)
    logits = torch.where(infinite.any(dim=-1, keepdim=True), torch.where(infinite, 0.0, -math.inf), logits)
    banned = torch.isneginf(logits.amax(dim=-1))  # (B,)
    if bool(banned.any()):
        row = int(banned.nonzero()[0, 0])
        if bool(not_a_number[row]):
            raise ValueError(
                f"row {row}: the logits are not finite (NaN), nothing can be drawn; the model's activations "
                "overflowed: lower the steering vector or scale, or check the adapter's or the model's weights"
            )
        raise ValueError(
            f"row {row}: every token has logit -inf, nothing is left to draw; the bans, biases or limits exclude "
            "the whole vocabulary"
        )
    return logits


def draw(probs: torch.Tensor, generator: Generators = None) -> torch.Tensor:
    """One index per row of probabilities (B, V) -> (B,), index i with probability probs[:, i] / the row's sum.

    Inverse CDF: one uniform number per row (from `generator`, or from generator[i] for row i), placed on the
    running sum. Never an index of probability 0: the point is kept strictly below the total, and `right=True`
    lands on the first sum above it, a step up. (torch.multinomial draws one random number per vocabulary entry:
    ~1 ms a row at V = 50257 on a CPU, more than a 124M decode step's sampling should cost; this is ~0.04 ms.)
    """
    cdf = probs.cumsum(dim=-1)  # (B, V), non-decreasing
    total = cdf[:, -1:]  # (B, 1)
    if generator is None or isinstance(generator, torch.Generator):
        uniform = torch.rand(total.shape, generator=generator, device=probs.device, dtype=cdf.dtype)
    else:
        if len(generator) != total.size(0):
            raise ValueError(f"{len(generator)} generators for {total.size(0)} rows; pass one per row")
        uniform = torch.cat(
            [torch.rand((1, 1), generator=one, device=probs.device, dtype=cdf.dtype) for one in generator]
        )
    point = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))  # in [0, total)
    return torch.searchsorted(cdf, point, right=True).squeeze(-1).clamp_(max=probs.size(-1) - 1)
