"""How every decoder (`stream`, beam search) starts from a prompt: the options of its loop (DecodeOptions), the
prompt's check and truncation, its prefill into a KV cache.

Notation: B = batch size, T = prompt length (columns, padding included), V = vocab_size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from gpt2.model import check_token_ids

if TYPE_CHECKING:
    from gpt2.model import GPT, KVCache

Truncate = Literal["left"] | None


@dataclass(frozen=True)
class DecodeOptions:
    """How the decode loop runs, apart from what to draw (that is SamplingParams and the processors)."""

    pad_token_id: int | None = None
    """What a stopped row receives (default: the first stop token id, else 0)."""
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    """A row also stops after its last tokens equal one of these id sequences."""
    vocab_limit: int | None = None
    """Never draw ids >= this (a model whose vocabulary was padded beyond its tokenizer's)."""
    truncate: Truncate = None
    """'left': a prompt longer than block_size keeps its last block_size columns (otherwise an error)."""
    slide_by: int | None = None
    """k: the re-prefill on a full cache keeps block_size - k tokens (module docstring); default block_size // 4."""
    compile: bool = False
    """torch.compile the one-token decode step (worth it on GPU; the first call compiles)."""
    native: bool | None = None
    """Decode steps in the native decoder (gpt2.cpu.decoder; same logits within rounding): None uses it
    where it can run the model (a CPU model in eval mode with readable layers, kernels built), True requires it,
    False never uses it. Prefills always run the model."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_sequences", tuple(tuple(sequence) for sequence in self.stop_sequences))
        if self.truncate not in (None, "left"):
            raise ValueError(f"truncate must be None (error on a too-long prompt) or 'left', got {self.truncate!r}")
        limit = self.vocab_limit
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ValueError(f"vocab_limit must be a positive integer (the tokenizer's size), got {limit!r}")
        if any(len(sequence) == 0 for sequence in self.stop_sequences):
            raise ValueError("stop_sequences contains an empty sequence; every stop sequence needs a token")


def truncated_prompt(model: GPT, idx: torch.Tensor, truncate: Truncate) -> torch.Tensor:
    """idx (B, T), cut to its last block_size columns when truncate='left'."""
    block_size = model.config.block_size
    return idx[:, -block_size:] if truncate == "left" and idx.size(1) > block_size else idx


def prefill(
    model: GPT, tokens: torch.Tensor, mask: torch.Tensor | None, *, start: int, end: int, cache: KVCache
) -> torch.Tensor:
    """Run columns [start, end) through the model into an empty cache; the last column's logits (B, V).
    Position ids come from the window's mask (each row's first real token at position 0) or count from 0."""
    window_mask = mask[:, start:end] if mask is not None else None
    hidden = model.hidden_states(tokens[:, start:end], attention_mask=window_mask, kv_cache=cache, validate=False)
    return model.lm_head(hidden[:, -1])  # only the last position's logits are needed: (B, V)


def check_prompt(model: GPT, idx: Any, attention_mask: Any, truncate: Truncate) -> None:
    """Validate the prompt batch once, so the decode loop can call the model without per-step checks."""
    config = model.config
    if truncate not in (None, "left"):
        raise ValueError(f"truncate must be None (error on a too-long prompt) or 'left', got {truncate!r}")
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
        shape = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
        raise ValueError(f"idx must be a (B, T) tensor of integer token ids, got {shape}; add a batch dimension")
    B, T = idx.shape
    if B == 0 or T == 0:
        raise ValueError(f"idx must hold at least one prompt of at least one token, got shape {(B, T)}")
    if T > config.block_size and truncate != "left":
        raise ValueError(
            f"prompt of {T} tokens exceeds the model's context block_size={config.block_size}; shorten it or pass "
            "truncate='left' to keep its last block_size tokens"
        )
    check_token_ids(idx, config.vocab_size)
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != idx.shape:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else attention_mask
        raise ValueError(f"attention_mask must have the shape of idx {(B, T)}, got {shape}")
    if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
    if not bool(attention_mask[:, -1].all()) or bool((attention_mask[:, 1:] < attention_mask[:, :-1]).any()):
        raise ValueError(
            "attention_mask must describe left padding (0s then 1s in every row, last column 1): generation "
            "continues after the last column; build the batch with gpt2.inference.generation.left_pad"
        )


def check_id_list(name: str, ids: Iterable[int] | None, vocab_size: int) -> list[int]:
    """ids as a list, each checked to be a token id in [0, vocab_size); an error names `name` and the value."""
    values = [] if ids is None else list(ids)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
            raise ValueError(f"{name} holds {value!r}, which is not a token id in [0, {vocab_size})")
    return values
