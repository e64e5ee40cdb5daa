"""One-token decode steps in native code: the whole model (embeddings, blocks, final LayerNorm, LM head) in one
call to the C++ decoder of gpt2.cpu.kernels, reading the model's own weights.

`native_decoder(model)` gives a `NativeDecoder` for a CPU model in eval mode whose linear layers it can read
(plain nn.Linear or `OneDNNLinear` in float32 or bfloat16, and `NativeLinear`), or None (a GPU, training mode, LoRA
wrappers, the PyTorch-only layouts, no kernels on this machine): callers then run `model(...)` as before.

`step` computes what `model(tokens (B, 1), kv_cache=cache, position_ids=..., attention_mask=...)` computes for
the last position: it writes the new keys and values at `cache.length`, attends over columns [0, length] and
advances the cache. Activations stay float32 inside the step whatever the weights' dtype (a bfloat16 model's
forward rounds them to bfloat16 after every op), so its logits sit within rounding of the model's (tested).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn as nn

from gpt2.cpu.kernels import BLOCK, KIND, NativeLinear, active_isa, library_name, native_ops, use_native_kernels
from gpt2.cpu.layouts import OneDNNLinear

if TYPE_CHECKING:
    from gpt2.model import GPT, Block, KVCache

LinearSpec = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int, int]  # weight, scale, bias, kind, out
FLOAT32_MAX_ROWS = 4
"""Steps of more rows than this run faster through the model when its float32 layers are `OneDNNLinear`: oneDNN's
products read each (packed) weight once for all rows, the native float32 product once every 4 rows (for the 124M
model on a 2-core AMD EPYC the native step is faster at 4 rows and slower from 6; benchmarks/inference/float32_rows.py
re-derives it)."""


class NativeDecoder:
    """The C++ decoder holding references to a model's weights (no copies but float32 LayerNorm parameters)."""

    def __init__(self, model: GPT, linears: list[LinearSpec], *, isa: str, max_rows: int | None = None) -> None:
        self.max_rows = max_rows  # None: every step is fastest here
        config = model.config
        transformer = model.transformer
        norms: list[torch.Tensor] = []
        for block in _blocks(model):
            for norm in (block.ln_1, block.ln_2):
                norms += [norm.weight.detach(), _bias_or_zeros(norm.bias, config.n_embd)]
        norms += [transformer.ln_f.weight.detach(), _bias_or_zeros(transformer.ln_f.bias, config.n_embd)]
        weights, scales, biases, kinds, outs = (list(column) for column in zip(*linears, strict=True))
        native_ops(isa)  # the kernels loaded, or a clear error
        self.isa = isa
        self._decoder = getattr(torch.classes, library_name(isa)).Decoder(
            config.n_head,
            config.layer_norm_eps,
            transformer.wte.weight.detach(),
            transformer.wpe.weight.detach(),
            norms,
            weights,
            scales,
            biases,
            kinds,
            outs,
        )

    def takes(self, rows: int) -> bool:
        """Whether a step of `rows` rows is fastest here; callers that may choose run the model otherwise."""
        return self.max_rows is None or rows <= self.max_rows

    @torch.no_grad()
    def step(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        *,
        positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Feed one token per row: tokens (B,) -> next-token logits (B, V) float32.

        positions (B,): each row's position id (default: cache.length for every row). key_mask (B, length + 1):
        1 where a row may attend, the new column included (default: every column). The cache's k and v, (L, B,
        nh, max_len, hs) float32 or bfloat16, get the new column at cache.length; the length then advances."""
        B, column = tokens.shape[0], cache.length
        if positions is None:
            positions = torch.full((B,), column, dtype=torch.long)
        logits = self._decoder.step(tokens.view(B), positions.view(B), key_mask, cache.k, cache.v, column)
        cache.length = column + 1
        return logits

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Feed T consecutive tokens of one sequence: tokens (T,) -> the logits after each (T, V) float32.

        What `model(tokens (1, T), kv_cache=cache)` computes, the weights read once for all T rows (a speculative
        verification, a draft catching up): token t goes to column cache.length + t at that position and attends
        causally. The cache (L, 1, nh, max_len, hs) advances by T."""
        T, column = tokens.shape[0], cache.length
        positions = torch.arange(column, column + T)
        logits = self._decoder.extend(tokens.view(T), positions, cache.k, cache.v, column)
        cache.length = column + T
        return logits


def native_decoder(model: GPT, *, isa: str | None = None) -> NativeDecoder | None:
    """A NativeDecoder for `model`, or None where the native step cannot run it (module docstring). isa: the kernel
    build it runs on (gpt2.cpu.kernels.ISAS; default the active one, as inference picks it)."""
    config = model.config
    device = model.transformer.wte.weight.device
    if device.type != "cpu" or model.training or config.n_embd % BLOCK:
        return None
    if isa is None:
        if not use_native_kernels():
            return None
        isa = active_isa()
    if model.transformer.wte.weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    modules: list[nn.Module] = []
    for block in _blocks(model):
        modules += [block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj]
    modules.append(model.lm_head)
    linears = [_linear_spec(module) for module in modules]
    if any(spec is None for spec in linears):
        return None
    max_rows = FLOAT32_MAX_ROWS if any(isinstance(module, OneDNNLinear) for module in modules) else None
    return NativeDecoder(model, [spec for spec in linears if spec is not None], isa=isa, max_rows=max_rows)


def _linear_spec(module: nn.Module) -> LinearSpec | None:
    """What the C++ decoder needs of one linear layer, or None for a layer it cannot read."""
    if isinstance(module, NativeLinear):
        return module.weight_packed, module.scale, module.bias, module.kind, module.out_features
    plain = type(module) in (nn.Linear, OneDNNLinear)  # the weight as nn.Linear holds it
    if not isinstance(module, nn.Linear) or not plain or module.weight.dtype not in (torch.float32, torch.bfloat16):
        return None  # other subclasses and wrappers (LoRA, the split and int8/int4 layouts) keep the PyTorch path
    weight = module.weight.detach()
    if not weight.is_contiguous():
        return None
    kind = KIND["float32"] if weight.dtype == torch.float32 else KIND["bfloat16"]
    bias = None if module.bias is None else module.bias.detach()
    return weight, None, bias, kind, module.out_features


def _blocks(model: GPT) -> list[Block]:
    return [cast("Block", block) for block in model.transformer.h]


def _bias_or_zeros(bias: torch.Tensor | None, size: int) -> torch.Tensor:
    return torch.zeros(size) if bias is None else bias.detach()
