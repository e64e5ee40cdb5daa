"""Model configuration: one frozen dataclass, validated at construction, with named presets."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

AttentionImpl = Literal["sdpa", "explicit"]

GPT2_VOCAB_SIZE = 50257  # 50,000 merges + 256 byte tokens + <|endoftext|>
GPT2_CONTEXT = 1024


def is_integer(value: object) -> TypeGuard[int]:
    """Whether `value` is an int and not a bool: Python's True is an int, but never a count, a size or a token id
    here. The one integer check of the package's validations.

    >>> is_integer(3), is_integer(True), is_integer(3.0)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: object) -> TypeGuard[int | float]:
    """Whether `value` is an int or a float, not a bool, and a finite float: NaN, infinity and an integer past
    float's range (a JSON `1` followed by 400 zeros) are not, since every such value ends up as a float in a
    tensor. The one number check of the package's validations.

    >>> is_finite_number(0.5), is_finite_number(True), is_finite_number(float("inf")), is_finite_number(10**400)
    (True, False, False, False)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def shown(value: object, limit: int = 20) -> str:
    """`repr(value)`, cut to its first `limit` characters and "..." when longer: how an error message quotes a
    value it was given, so a 400-digit number or a megabyte of text is never echoed whole.

    >>> shown(10**30), shown("ok")
    ('10000000000000000000...', "'ok'")
    """
    try:
        text = repr(value)
    except ValueError:  # an int past Python's limit on digits converted to text
        return f"an integer of about {math.log10(2) * value.bit_length():.0f} digits" if isinstance(value, int) else "?"
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT-2 model.

    >>> GPTConfig.from_name("gpt2").n_layer
    12
    >>> GPTConfig(n_embd=100, n_head=3)
    Traceback (most recent call last):
    ...
    ValueError: n_embd (100) must be divisible by n_head (3): pick n_embd = n_head * head_dim
    """

    vocab_size: int = GPT2_VOCAB_SIZE
    """Number of token ids; the LM head produces one logit per id."""
    block_size: int = GPT2_CONTEXT
    """Context length: the number of learned position embeddings (HF: n_positions)."""
    n_layer: int = 12
    """Number of transformer blocks."""
    n_head: int = 12
    """Attention heads per block; head_dim = n_embd // n_head."""
    n_embd: int = 768
    """Width of the residual stream."""
    dropout: float = 0.0
    """Dropout on embeddings, attention weights and residual branches (GPT-2 trained with 0.1)."""
    bias: bool = True
    """Biases in the linear layers and LayerNorms (GPT-2 has them)."""
    layer_norm_eps: float = 1e-5
    """LayerNorm epsilon (HF: layer_norm_epsilon)."""
    attn_impl: AttentionImpl = "sdpa"
    """'sdpa': torch's fused scaled_dot_product_attention (fast path); 'explicit': the written-out
    softmax(q k^T / sqrt(hs)) v, the reference the fast path is tested against."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not is_integer(value) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}): pick n_embd = n_head * head_dim"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not self.layer_norm_eps > 0.0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps!r}")
        if self.attn_impl not in ("sdpa", "explicit"):
            raise ValueError(f"attn_impl must be 'sdpa' or 'explicit', got {self.attn_impl!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> GPTConfig:
        """A preset by name, with optional field overrides: `GPTConfig.from_name("gpt2", dropout=0.1)`."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    def replace(self, **changes: Any) -> GPTConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ValueError(f"unknown GPTConfig field(s) {unknown}; valid fields: {sorted(fields)}")
        return cls(**values)


# The four released GPT-2 sizes, then small shapes for CPU work (same architecture, fewer/narrower layers).
PRESETS: dict[str, GPTConfig] = {
    "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600),
    "gpt2-tiny": GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=128),
    "gpt2-mini": GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=256),
    "gpt2-small-cpu": GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256),
}
