"""GPT-2, top to bottom.

Notation used in tensor comments: B = batch size, T = new positions in this call, S = key positions visible
(past + T), C = n_embd, nh = n_head, hs = head size (C // nh), V = vocab_size.

Parameter names are the checkpoint's names (`transformer.wte`, `transformer.h.N.attn.c_attn`, ...), so loading
a released checkpoint is a copy plus one transpose of the Conv1D weights (gpt2.weights). This module imports only
gpt2.config: loading, saving and generation live in gpt2.weights and gpt2.inference. Linear layers here
are `nn.Linear` (weight [out, in]); OpenAI's and HF's "Conv1D" store the same matrix as [in, out].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from gpt2.config import GPTConfig

IGNORE_INDEX = -100  # targets with this value do not count in the loss (padding)
INIT_STD = 0.02  # GPT-2's initializer_range


class TokenIdError(ValueError):
    """A token id outside the model's vocabulary: the tokenizer does not match the model."""


def check_token_ids(idx: torch.Tensor, vocab_size: int) -> None:
    """Refuse any id in `idx` (integer tensor, any shape) outside [0, vocab_size), naming the first one.

    The one vocabulary check: the model, generation and inspection all call it (it syncs the device once).

    >>> check_token_ids(torch.tensor([[1, 2, 300]]), 300)
    Traceback (most recent call last):
    ...
    gpt2.model.TokenIdError: token id 300 is outside the vocabulary [0, 300); check the tokenizer matches the model
    """
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= vocab_size):
        bad = idx[(idx < 0) | (idx >= vocab_size)][0].item()
        raise TokenIdError(
            f"token id {bad} is outside the vocabulary [0, {vocab_size}); check the tokenizer matches the model"
        )


class GPTOutput(NamedTuple):
    """What `GPT.forward` returns: logits always (B, T, V); loss only when targets were given."""

    logits: torch.Tensor
    loss: torch.Tensor | None


@dataclass
class KVCache:
    """Preallocated keys and values of every layer, so decoding a token costs one position, not the prefix.

    k, v: (n_layer, B, nh, max_len, hs). `length` positions are filled; the next forward writes at
    [length, length + T) and then advances `length`. Create with `KVCache.empty(...)` or `model.new_kv_cache(...)`.
    """

    k: torch.Tensor
    v: torch.Tensor
    length: int = 0

    @classmethod
    def empty(
        cls,
        config: GPTConfig,
        batch_size: int,
        max_len: int | None = None,
        *,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> KVCache:
        max_len = config.block_size if max_len is None else max_len
        if not 0 < max_len <= config.block_size:
            raise ValueError(f"max_len must be in [1, block_size={config.block_size}], got {max_len}")
        shape = (config.n_layer, batch_size, config.n_head, max_len, config.head_dim)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def reset(self) -> None:
        self.length = 0


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a causal mask: softmax(q k^T / sqrt(hs) + mask) v, then a projection."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.explicit = config.attn_impl == "explicit"
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # fused q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        cache: tuple[torch.Tensor, torch.Tensor, int] | None = None,
        weights_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x: (B, T, C). mask: None for causal attention without padding (T > 1: over the T fresh positions;
        T == 1: the one new token sees all S keys), else a bool (B or 1, 1, T, S) where True means "may attend".
        cache: this layer's (k, v, past) buffers (B, nh, max_len, hs).
        weights_out: when given, the explicit path appends the (B, nh, T, S) attention weights to it."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if cache is not None:
            k_cache, v_cache, past = cache
            k_cache[:, :, past : past + T] = k
            v_cache[:, :, past : past + T] = v
            k, v = k_cache[:, :, : past + T], v_cache[:, :, : past + T]  # (B, nh, S, hs)

        dropout_p = self.dropout if self.training else 0.0
        if self.explicit or weights_out is not None:
            y = self._explicit_attention(q, k, v, mask, dropout_p, weights_out)
        else:
            # No mask: causal over T fresh positions, or (T == 1) one new token that sees every cached key.
            is_causal = mask is None and T > 1
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads side by side
        return self.resid_dropout(self.c_proj(y))

    def _explicit_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        dropout_p: float,
        weights_out: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        """The written-out reference. q: (B, nh, T, hs); k, v: (B, nh, S, hs) -> (B, nh, T, hs)."""
        T, S = q.size(-2), k.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, S)
        if mask is None:
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        if weights_out is not None:
            weights_out.append(att)
        att = F.dropout(att, p=dropout_p, training=dropout_p > 0)
        return att @ v


class MLP(nn.Module):
    """Position-wise feed-forward: C -> 4C -> GELU (tanh form, as GPT-2) -> C."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused kernel that keeps only its input for backward. The exact (erf) GELU would move a real
        # GPT-2's logits by ~1e-3: GPT-2 was trained with the tanh approximation, so that is the model.
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). The residual stream itself is
    never normalised; only the input of each branch is."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        cache: tuple[torch.Tensor, torch.Tensor, int] | None = None,
        weights_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache, weights_out)
        x = x + self.mlp(self.ln_2(x))
        return x


class Transformer(nn.Module):
    """The checkpoint's `transformer.*` modules: embeddings, the blocks, the final LayerNorm. A plain container
    (GPT.forward runs them), so the parameter names are the checkpoint's and each attribute has a type."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)  # token embeddings (V, C)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)  # learned positions (block_size, C)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)


class GPT(nn.Module):
    """The GPT-2 language model: token ids (B, T) -> next-token logits (B, T, V).

    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=100))
    >>> logits, loss = model(torch.tensor([[1, 2, 3]]), targets=torch.tensor([[2, 3, 4]]))
    >>> logits.shape
    torch.Size([1, 3, 100])
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one (V, C) matrix embeds and un-embeds
        # Activation checkpointing (training only): keep each block's input, recompute the block in backward.
        # Saves most activation memory for ~1/3 more compute; the gradients are the same.
        self.activation_checkpointing = False
        self.reset_parameters()

    # ----------------------------------------------------------------------------------------- init
    def reset_parameters(self) -> None:
        """GPT-2 init: weights N(0, 0.02); the projections that write into the residual stream (attn.c_proj,
        mlp.c_proj) N(0, 0.02 / sqrt(2 * n_layer)) so the stream's variance does not grow with depth (two
        residual additions per block); biases 0; LayerNorm gain 1, bias 0."""
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith("c_proj") else INIT_STD
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Distinct parameters (the tied head counted once); optionally without the embeddings."""
        n = sum(p.numel() for p in self.parameters())  # parameters() already yields a shared tensor once
        if exclude_embeddings:
            n -= self.transformer.wpe.weight.numel() + self.transformer.wte.weight.numel()
        return n

    # -------------------------------------------------------------------------------------- forward
    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        validate: bool = True,
    ) -> GPTOutput:
        """Logits for every position, and the mean cross-entropy against `targets` when given.

        idx: (B, T) integer token ids. targets: (B, T) next-token ids, IGNORE_INDEX (-100) where a position
        must not count. attention_mask: (B, S) with 1 for real tokens and 0 for padding, S = past + T (left-
        padded batches); position ids then default to the count of real tokens before each one, so every row
        starts at position 0 whatever its padding. kv_cache: written at [length, length + T), then advanced.
        validate=False skips the input checks (they read values back from the device): for callers, such as
        the decode loop, that validated their inputs once.
        """
        if validate:
            self._check_inputs(idx, targets, attention_mask, position_ids, kv_cache)
        x = self._hidden_states(idx, attention_mask, position_ids, kv_cache)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if targets is not None:
            flat_logits = logits.view(-1, logits.size(-1)).float()  # (B*T, V); fp32 even under autocast
            loss = F.cross_entropy(flat_logits, targets.reshape(-1), ignore_index=IGNORE_INDEX)
        return GPTOutput(logits, loss)

    def hidden_states(
        self,
        idx: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        validate: bool = True,
    ) -> torch.Tensor:
        """The final-LayerNorm output (B, T, C) that the LM head turns into logits, with the same input checks
        and options as `forward`. `model.lm_head(h[:, positions])` then gives logits for just those positions,
        which saves most of the (B, T, V) head when only some positions are needed (scoring, prefill)."""
        if validate:
            self._check_inputs(idx, None, attention_mask, position_ids, kv_cache)
        return self._hidden_states(idx, attention_mask, position_ids, kv_cache)

    def _hidden_states(
        self,
        idx: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        kv_cache: KVCache | None,
        weights_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """hidden_states without input checks: embeddings, the blocks, the final LayerNorm -> (B, T, C)."""
        B, T = idx.shape
        past = kv_cache.length if kv_cache is not None else 0
        if position_ids is None:
            if attention_mask is not None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (B, T)
            else:
                position_ids = torch.arange(past, past + T, device=idx.device).unsqueeze(0)  # (1, T)
        mask = self._attention_mask(attention_mask, T, past, idx.device)

        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(position_ids))  # (B, T, C)
        for i, block in enumerate(self.transformer.h):
            cache = (kv_cache.k[i], kv_cache.v[i], past) if kv_cache is not None else None
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, mask, cache, weights_out, use_reentrant=False)
            else:
                x = block(x, mask, cache, weights_out)
        if kv_cache is not None:
            kv_cache.length = past + T
        return self.transformer.ln_f(x)  # (B, T, C)

    @staticmethod
    def _attention_mask(
        attention_mask: torch.Tensor | None, T: int, past: int, device: torch.device
    ) -> torch.Tensor | None:
        """The boolean mask attention uses: None when no padding and either nothing is cached (plain causal
        attention, the fused kernels' fast path) or one new token is decoded (it sees every key); else
        (B or 1, 1, T, S) with True = may attend."""
        S = past + T
        if attention_mask is None and (past == 0 or T == 1):
            return None
        causal = torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=past)  # (T, S)
        if attention_mask is None:
            return causal.view(1, 1, T, S)
        mask = causal.view(1, 1, T, S) & attention_mask.bool().view(-1, 1, 1, S)  # (B, 1, T, S)
        # A padding query sees no real key: let it see itself so softmax stays finite (its output is unused).
        diagonal = torch.zeros(T, S, dtype=torch.bool, device=device)
        diagonal[torch.arange(T, device=device), torch.arange(past, S, device=device)] = True
        return mask | diagonal.view(1, 1, T, S)

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The softmax attention weights of every layer, computed on the explicit path: n_layer tensors of
        shape (B, nh, T, T). For inspection; the model's outputs are unchanged by asking."""
        self._check_inputs(idx, None, attention_mask, None, None)
        weights: list[torch.Tensor] = []
        self._hidden_states(idx, attention_mask, None, None, weights_out=weights)
        return weights

    def _check_inputs(
        self,
        idx: Any,
        targets: Any,
        attention_mask: Any,
        position_ids: Any,
        kv_cache: KVCache | None,
    ) -> None:
        """Refuse bad input with a message naming it, before any kernel runs."""
        V, block_size = self.config.vocab_size, self.config.block_size
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"idx must be a torch.Tensor of token ids with shape (B, T), got {type(idx).__name__}")
        if idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must hold integer token ids (torch.long), got dtype {idx.dtype}; use idx.long()")
        if idx.dim() != 2:
            raise ValueError(
                f"idx must have shape (B, T), got {idx.dim()} dimension(s) {tuple(idx.shape)}; "
                "add a batch dimension with idx.unsqueeze(0)"
            )
        B, T = idx.shape
        if T == 0:
            raise ValueError("idx has no positions (T = 0); pass at least one token")
        past = kv_cache.length if kv_cache is not None else 0
        if past + T > block_size:
            where = f" ({past} cached + {T} new)" if past else ""
            raise ValueError(
                f"sequence length {past + T}{where} exceeds the model's context length block_size={block_size}; "
                "truncate the input to the last block_size tokens"
            )
        checking_values = not torch.compiler.is_compiling()  # value checks sync the device; skip under compile
        if checking_values:
            check_token_ids(idx, V)
        if targets is not None:
            if not isinstance(targets, torch.Tensor) or targets.shape != idx.shape:
                shape = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
                raise ValueError(f"targets must have the same shape as idx {tuple(idx.shape)}, got {shape}")
            if targets.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"targets must hold integer token ids (torch.long), got dtype {targets.dtype}")
            if checking_values:
                bad_targets = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= V))
                if bool(bad_targets.any()):
                    bad = targets[bad_targets][0].item()
                    raise ValueError(f"target id {bad} is outside the vocabulary [0, {V}) and is not {IGNORE_INDEX}")
        if kv_cache is not None:
            if kv_cache.batch_size != B:
                raise ValueError(f"kv_cache was made for batch size {kv_cache.batch_size}, idx has batch size {B}")
            if past + T > kv_cache.max_len:
                raise ValueError(f"kv_cache holds {kv_cache.max_len} positions; {past} used + {T} new does not fit")
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != (B, past + T):
                shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else attention_mask
                raise ValueError(
                    f"attention_mask must have shape (B, past + T) = {(B, past + T)} with 1 for tokens and 0 for "
                    f"padding, got {shape}"
                )
            if checking_values and bool(((attention_mask != 0) & (attention_mask != 1)).any()):
                raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
        if position_ids is not None:
            if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 or position_ids.shape[-1] != T:
                raise ValueError(f"position_ids must have shape (B, T) or (1, T) with T={T}")
            if checking_values and (int(position_ids.min()) < 0 or int(position_ids.max()) >= block_size):
                raise ValueError(f"position_ids must lie in [0, block_size={block_size})")

    # ------------------------------------------------------------------------------ conveniences
    def new_kv_cache(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> KVCache:
        """An empty cache on this model's device, in its parameters' dtype unless told otherwise."""
        weight = self.transformer.wte.weight
        return KVCache.empty(self.config, batch_size, max_len, device=weight.device, dtype=dtype or weight.dtype)
