"""Activations by name: read any intermediate tensor of a forward pass, or replace it (patching, ablation).

The model's own forward stays as it is (fused attention, no hook checks, nothing to pay when nobody looks).
This module runs its own forward that calls the model's submodules in the model's order -- `wte`, `wpe`,
`drop`; in each block `ln_1`, `attn.c_attn`, the attention written out as in the model's explicit reference
path, `attn.c_proj`, `attn.resid_dropout`, `ln_2`, `mlp.c_fc`, the tanh GELU, `mlp.c_proj`, `mlp.dropout`; then
`ln_f` and `lm_head` -- so it computes the model's function on any checkpoint (tests pin its logits, patterns
and residuals to the model's and to transformers'), and works on the inference layouts of gpt2.cpu too,
since it only calls the modules it finds.

Activation names are TransformerLens' (HookedTransformer on GPT-2), so recipes written for it read the same:

    hook_embed, hook_pos_embed                      (B, T, C) token and position embeddings
    blocks.{i}.hook_resid_pre                       (B, T, C) residual stream entering block i
    blocks.{i}.ln1.hook_normalized                  (B, T, C) ln_1 output (with its gain and bias)
    blocks.{i}.attn.hook_q / hook_k / hook_v        (B, T, nh, hs)
    blocks.{i}.attn.hook_attn_scores                (B, nh, T, T) q k^T / sqrt(hs), -inf above the diagonal
    blocks.{i}.attn.hook_pattern                    (B, nh, T, T) softmax of the scores
    blocks.{i}.attn.hook_z                          (B, T, nh, hs) pattern @ v, before c_proj
    blocks.{i}.hook_attn_out                        (B, T, C) attention branch output
    blocks.{i}.hook_resid_mid                       (B, T, C) resid_pre + attn_out
    blocks.{i}.ln2.hook_normalized                  (B, T, C)
    blocks.{i}.mlp.hook_pre / hook_post             (B, T, 4C) before / after the GELU
    blocks.{i}.hook_mlp_out                         (B, T, C)
    blocks.{i}.hook_resid_post                      (B, T, C) resid_mid + mlp_out
    ln_final.hook_normalized                        (B, T, C) ln_f output, what lm_head reads

B = batch, T = positions, C = n_embd, nh = n_head, hs = C // nh. The cache holds the tensors that flowed on
(after any hook replaced them). Gradients are recorded as usual; wrap calls in `torch.no_grad()` to save memory.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import cast

import torch
import torch.nn.functional as F

from gpt2.model import GPT, Block
from gpt2.model import check_token_ids as check_vocabulary

HookFn = Callable[[torch.Tensor, str], torch.Tensor | None]
"""fn(tensor, name) -> None to leave the tensor as it is, or a tensor of the same shape to use instead."""
NameFilter = str | Iterable[str] | Callable[[str], bool] | None
"""Which activations to keep: None = all, one name, several names, or a predicate on names."""

GLOBAL_NAMES = ("hook_embed", "hook_pos_embed")
BLOCK_NAMES = (  # per block, in the order the forward produces them
    "hook_resid_pre",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_attn_scores",
    "attn.hook_pattern",
    "attn.hook_z",
    "hook_attn_out",
    "hook_resid_mid",
    "ln2.hook_normalized",
    "mlp.hook_pre",
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
)
FINAL_NAMES = ("ln_final.hook_normalized",)


def hook_names(n_layer: int) -> list[str]:
    """Every activation name of a model with `n_layer` blocks, in the order the forward produces them.

    >>> hook_names(2)[:3]
    ['hook_embed', 'hook_pos_embed', 'blocks.0.hook_resid_pre']
    >>> len(hook_names(12))
    183
    """
    blocks = [f"blocks.{i}.{name}" for i in range(n_layer) for name in BLOCK_NAMES]
    return [*GLOBAL_NAMES, *blocks, *FINAL_NAMES]


class ActivationCache(Mapping[str, torch.Tensor]):
    """The activations `run_with_cache` kept, by name (a read-only mapping in forward order)."""

    def __init__(self, tensors: dict[str, torch.Tensor], n_layer: int) -> None:
        self._tensors = tensors
        self.n_layer = n_layer

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            if name in hook_names(self.n_layer):
                raise KeyError(f"{name!r} was not cached; pass it in names= to run_with_cache") from None
            raise KeyError(_unknown_name_message(name, self.n_layer)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} of {len(hook_names(self.n_layer))} activations)"


def run_with_cache(
    model: GPT,
    idx: torch.Tensor,
    names: NameFilter = None,
    *,
    fwd_hooks: Sequence[tuple[str, HookFn]] = (),
) -> tuple[torch.Tensor, ActivationCache]:
    """The logits (B, T, V) of `idx` (B, T) and the activations named by `names` (all when None).

    Only what is asked for is kept: `names` may be one name, a list of names, or a predicate such as
    `lambda name: name.endswith("hook_pattern")`. An unknown name is a ValueError listing the valid ones.
    `fwd_hooks` run as in `run_with_hooks`; the cache then holds the replaced tensors.

    >>> from gpt2.config import GPTConfig
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=100)).eval()
    >>> logits, cache = run_with_cache(model, torch.tensor([[1, 2, 3]]), ["blocks.0.attn.hook_pattern"])
    >>> cache["blocks.0.attn.hook_pattern"].shape  # (B, nh, T, T)
    torch.Size([1, 4, 3, 3])
    >>> list(cache)
    ['blocks.0.attn.hook_pattern']
    """
    n_layer = model.config.n_layer
    keep = _select_names(names, n_layer)
    hooks = _group_hooks(fwd_hooks, n_layer)
    cached: dict[str, torch.Tensor] = {}

    def visit(name: str, tensor: torch.Tensor) -> torch.Tensor:
        for fn in hooks.get(name, ()):
            tensor = _apply_hook(fn, tensor, name)
        if name in keep:
            cached[name] = tensor
        return tensor

    logits = _instrumented_forward(model, idx, visit)
    return logits, ActivationCache(cached, n_layer)


def run_with_hooks(model: GPT, idx: torch.Tensor, fwd_hooks: Sequence[tuple[str, HookFn]]) -> torch.Tensor:
    """The logits (B, T, V) of `idx` (B, T) when each hook `fn(tensor, name)` may replace the activation it
    names (return None to leave it). Several hooks on one name run in the order given, each seeing the last
    one's result. The replacement must keep the shape; what follows is computed from it.

    Zero-ablate head 3 of block 0 (its z feeds c_proj as zeros):

    >>> from gpt2.config import GPTConfig
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=100)).eval()
    >>> def zero_head(z, name):  # z: (B, T, nh, hs)
    ...     z = z.clone()
    ...     z[:, :, 3] = 0.0
    ...     return z
    >>> logits = run_with_hooks(model, torch.tensor([[1, 2, 3]]), [("blocks.0.attn.hook_z", zero_head)])
    """
    hooks = _group_hooks(fwd_hooks, model.config.n_layer)

    def visit(name: str, tensor: torch.Tensor) -> torch.Tensor:
        for fn in hooks.get(name, ()):
            tensor = _apply_hook(fn, tensor, name)
        return tensor

    return _instrumented_forward(model, idx, visit)


# ------------------------------------------------------------------------------------------ the forward
def _instrumented_forward(
    model: GPT, idx: torch.Tensor, visit: Callable[[str, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """The model's forward on (B, T) token ids with every named activation passed through `visit(name, x)`,
    which returns the tensor to carry on with. Returns the logits (B, T, V)."""
    check_token_ids(model, idx)
    transformer = model.transformer
    B, T = idx.shape
    C = model.config.n_embd
    positions = torch.arange(T, device=idx.device)  # (T,)
    embed = visit("hook_embed", transformer.wte(idx))  # (B, T, C)
    pos_embed = visit("hook_pos_embed", transformer.wpe(positions).expand(B, T, C))  # (B, T, C), a view
    x = transformer.drop(embed + pos_embed)
    return model.lm_head(forward_from(model, x, 0, visit))  # (B, T, V)


def forward_from(
    model: GPT, resid_pre: torch.Tensor, layer: int, visit: Callable[[str, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """The rest of the instrumented forward from the residual stream entering block `layer`, resid_pre
    (B, T, C): blocks `layer`.. with their named activations through `visit`, then `ln_final` -> (B, T, C),
    what lm_head reads. Patching resumes here so the blocks before the patched one are not run again."""
    B, T, C = resid_pre.shape
    nh = model.config.n_head
    hs = C // nh
    dropout_p = model.config.dropout if model.training else 0.0
    causal = torch.ones(T, T, dtype=torch.bool, device=resid_pre.device).tril()  # (T, T) True = may attend
    x = resid_pre
    for i, block in enumerate(blocks(model)[layer:], start=layer):
        prefix = f"blocks.{i}."
        x = visit(prefix + "hook_resid_pre", x)

        # attention branch: the model's explicit reference path, one step at a time
        attn = block.attn
        h = visit(prefix + "ln1.hook_normalized", block.ln_1(x))
        q, k, v = attn.c_attn(h).split(C, dim=2)
        q = visit(prefix + "attn.hook_q", q.view(B, T, nh, hs))
        k = visit(prefix + "attn.hook_k", k.view(B, T, nh, hs))
        v = visit(prefix + "attn.hook_v", v.view(B, T, nh, hs))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, nh, T, hs)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        scores = visit(prefix + "attn.hook_attn_scores", scores.masked_fill(~causal, float("-inf")))
        pattern = visit(prefix + "attn.hook_pattern", F.softmax(scores, dim=-1))
        weights = F.dropout(pattern, p=dropout_p, training=dropout_p > 0)
        z = visit(prefix + "attn.hook_z", (weights @ v).transpose(1, 2))  # (B, T, nh, hs)
        attn_out = attn.resid_dropout(attn.c_proj(z.reshape(B, T, C)))
        attn_out = visit(prefix + "hook_attn_out", attn_out)
        x = visit(prefix + "hook_resid_mid", x + attn_out)

        # MLP branch
        mlp = block.mlp
        h = visit(prefix + "ln2.hook_normalized", block.ln_2(x))
        pre = visit(prefix + "mlp.hook_pre", mlp.c_fc(h))  # (B, T, 4C)
        post = visit(prefix + "mlp.hook_post", F.gelu(pre, approximate="tanh"))  # GPT-2's GELU, as the model
        mlp_out = visit(prefix + "hook_mlp_out", mlp.dropout(mlp.c_proj(post)))
        x = visit(prefix + "hook_resid_post", x + mlp_out)

    return visit("ln_final.hook_normalized", model.transformer.ln_f(x))  # (B, T, C)


def blocks(model: GPT) -> list[Block]:
    """The model's blocks, typed (a ModuleList yields plain Modules)."""
    return [cast(Block, block) for block in model.transformer.h]


def check_token_ids(model: GPT, idx: object) -> None:
    """Refuse anything but (B, T) integer ids that fit the model's vocabulary and context, naming the fix."""
    if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.int64, torch.int32) or idx.dim() != 2:
        got = f"{idx.dtype} tensor of shape {tuple(idx.shape)}" if isinstance(idx, torch.Tensor) else type(idx)
        raise ValueError(f"idx must be integer token ids of shape (B, T), got {got}; e.g. torch.tensor([ids])")
    T, block_size, vocab_size = idx.shape[1], model.config.block_size, model.config.vocab_size
    if not 0 < T <= block_size:
        raise ValueError(f"idx has {T} positions; pass between 1 and block_size={block_size} tokens")
    check_vocabulary(idx, vocab_size)


# ------------------------------------------------------------------------------------------ names
def _select_names(names: NameFilter, n_layer: int) -> set[str]:
    valid = hook_names(n_layer)
    if names is None:
        return set(valid)
    if callable(names):
        return {name for name in valid if names(name)}
    requested = [names] if isinstance(names, str) else list(names)
    for name in requested:
        if not isinstance(name, str) or name not in valid:
            raise ValueError(_unknown_name_message(name, n_layer))
    return set(requested)


def _group_hooks(fwd_hooks: Sequence[tuple[str, HookFn]], n_layer: int) -> dict[str, list[HookFn]]:
    valid = set(hook_names(n_layer))
    grouped: dict[str, list[HookFn]] = {}
    for entry in fwd_hooks:
        if not (isinstance(entry, tuple) and len(entry) == 2 and callable(entry[1])):
            raise ValueError(f"each hook must be a (name, fn) pair with fn(tensor, name), got {entry!r}")
        name, fn = entry
        if name not in valid:
            raise ValueError(_unknown_name_message(name, n_layer))
        grouped.setdefault(name, []).append(fn)
    return grouped


def _apply_hook(fn: HookFn, tensor: torch.Tensor, name: str) -> torch.Tensor:
    result = fn(tensor, name)
    if result is None:
        return tensor
    if not isinstance(result, torch.Tensor) or result.shape != tensor.shape:
        got = tuple(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
        raise ValueError(f"the hook on {name!r} must return None or a tensor of shape {tuple(tensor.shape)}, got {got}")
    return result


def _unknown_name_message(name: object, n_layer: int) -> str:
    close = difflib.get_close_matches(str(name), hook_names(n_layer), n=3)
    suggestion = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    templates = [*GLOBAL_NAMES, *(f"blocks.{{i}}.{name}" for name in BLOCK_NAMES), *FINAL_NAMES]
    return f"unknown activation name {name!r}{suggestion}; valid names, with i in 0..{n_layer - 1}: " + ", ".join(
        templates
    )
