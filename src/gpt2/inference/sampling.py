"""Sampling: the one parameters dataclass (OpenAI's names) shared by the Python API, `gpt2 sample` and the
server, and the per-step draw from next-token logits (temperature, then top-k, then top-p, then one draw).

Both filters keep ties together (see `filter_top_k`, `filter_top_p`), so the kept set never depends on how a
sort orders equal values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# top-p counts a cumulative mass within this of p as having reached p: probabilities summed in float32 are
# off by ~1e-7, and a mass of exactly p must not pull in the next token because of it.
TOP_P_TOLERANCE = 1e-6


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to continue a prompt, with the OpenAI API's names; validated once, at construction.

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
    """Softmax temperature; 0 is greedy (argmax)."""
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
    """Continuations per prompt; the i-th uses seed + i when a seed is given."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, Sequence):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.stop_token_ids, Sequence):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not _is_int(self.max_tokens) or self.max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}; use 1.0 to disable nucleus filtering")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1, got {self.top_k!r}; use None to disable top-k filtering")
        if not all(isinstance(text, str) and text for text in self.stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        if not all(_is_int(token) and token >= 0 for token in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids (integers >= 0), got {self.stop_token_ids!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

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


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token per row from next-token logits (B, V) -> (B,) long. temperature 0 is greedy (argmax, first
    index on ties); otherwise softmax(logits / temperature) restricted by top-k then top-p, drawn with
    `generator` (torch's global generator when None)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        logits = filter_top_k(logits, top_k)
    if top_p is not None:
        logits = filter_top_p(logits, top_p)
    return draw(F.softmax(logits, dim=-1), generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of probabilities (B, V) -> (B,), index i with probability probs[:, i] / the row's sum.

    Inverse CDF: one uniform number per row, placed on the running sum. Never an index of probability 0: the
    point is kept strictly below the total, and `right=True` lands on the first sum above it, a step up.
    (torch.multinomial draws one random number per vocabulary entry: ~1 ms a row at V = 50257 on a CPU, more
    than a 124M decode step's sampling should cost; this is ~0.04 ms.)
    """
    cdf = probs.cumsum(dim=-1)  # (B, V), non-decreasing
    total = cdf[:, -1:]  # (B, 1)
    uniform = torch.rand(total.shape, generator=generator, device=probs.device, dtype=cdf.dtype)
    point = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))  # in [0, total)
    return torch.searchsorted(cdf, point, right=True).squeeze(-1)
