"""Inference-time weight layouts for fast decoding on a CPU. Each replaces the model's nn.Linear layers in
place, keeps the model's outputs (tested), and leaves a model that can no longer be trained.

Decoding one token reads every weight once (~500 MB in fp32 for the 124M model), so at small batch sizes a CPU
decodes at memory-bandwidth speed, and two things set the pace: how fast the kernels stream the weights, and how
many bytes each weight takes.

`prepare_for_inference(model, precision)` picks the fastest correct form. Where the native kernels build
(gpt2.cpu.kernels; a C++ compiler is all they need), float32 layers become `OneDNNLinear` (nn.Linear whose
products of many rows, prompts, run in oneDNN), bfloat16, int8 and int4 become `NativeLinear`, and decode steps run
in the native decoder (gpt2.cpu.decoder). Elsewhere it falls back to these PyTorch layouts, which compute the
same thing more slowly:

- `SplitLinear` (fp32, `optimize_for_inference(model)`): a one-row input turns each layer into a matrix-vector
  product, which torch's CPU BLAS may run on a single core. Storing W^T as `parts` column blocks (parts, in,
  out/parts) and multiplying with one batched matmul gives every core its own block to stream. Same arithmetic
  per output element, so the logits are unchanged.
- `Int8Linear` (`quantize_int8(model)`): each weight as int8 with one scale per output row (symmetric, absmax /
  127): a quarter of the bytes. Activations in bfloat16 where the CPU multiplies bfloat16 fast (AMX, or AMD's
  AVX512-BF16), float32 elsewhere (`layout_dtype`: on an AVX2-only CPU, bfloat16 is emulated and costs
  several times float32 in prompt batches, docs/performance.md). Embeddings, LayerNorms and biases stay as they
  are. The accuracy cost is measured by `gpt2 eval perplexity --dtype X` (docs/performance.md).
- `Int4Linear` (`quantize_int4(model)`, CPU only): each group of 32 weights along the input as 4-bit codes
  0..15 with its own scale and minimum (asymmetric), two codes a byte, in torch's CPU int4 kernel
  (`aten._weight_int4pack_mm_for_cpu`), activations as for int8: 5 bits a weight with the scales, as llama.cpp's
  q4_0 takes 4.5.

In all of them, the tied LM head gets its own copy in the new layout while `wte` keeps serving the embedding
lookups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2.cpu.kernels import (
    BLOCK,
    INT4_LEVELS,
    NativeLinear,
    onednn_available,
    quantize_int8_rows,
    use_native_kernels,
)
from gpt2.runtime.device import cpu_prefers_bf16

# The rows oneDNN lays a packed weight out for: prompts and batched steps of 1-1024 rows all ran as fast as with
# the layout for their own count (16 and 64 measured alike; 1 is slower for many rows).
PACKED_ROWS = 64
INT8_LARGE_WEIGHT = 2**23  # elements: beyond this (the LM head), dequantizing costs more (Int8Linear)
INT4_GROUP_SIZE = 32  # inputs sharing one scale and minimum, as in llama.cpp's q4_0 blocks
INT4_INNER_K_TILES = 2  # the packing's tile parameter (any of 2, 4, 8 on CPU: same results)
INT4_K_MULTIPLE = 16 * INT4_INNER_K_TILES  # the kernel's tile over the input dimension
INT4_N_MULTIPLE = 16  # ... and over the output dimension
M = TypeVar("M", bound=nn.Module)


class OneDNNLinear(nn.Linear):
    """nn.Linear whose float32 products on the CPU run in oneDNN (PyTorch's mkldnn backend) instead of the BLAS
    behind F.linear (MKL). MKL runs its AVX2 code on AMD CPUs; oneDNN uses AVX-512 there: 2.2-2.3x the speed of a
    prompt's products (64-1024 rows) and 1.8x at 1 row on a Zen 5 (`gpt2 bench prefill --precisions float32`). The
    same float32 arithmetic in another summation order (logits within 1e-4 of transformers', tested). Shares the
    weight and bias of the layer it replaces, so a tied LM head stays tied. Autograd and other dtypes take
    nn.Linear's path.

    oneDNN multiplies by a copy of the weight laid out in its own blocks (`packed_weight`, made once, and again
    if the weight is changed in place), as Inductor's frozen CPU graphs keep theirs: from a plain weight every
    product first reorders it. 124M on the 2-core Zen 5: prompts of 16 / 64 / 1024 tokens 1.26 / 1.11 / 1.03x
    faster, a decode step of 16 rows 1.26x (benchmarks/bench_float32_rows.py). The copy costs the weights' memory
    once more (the native decoder reads the plain weight)."""

    _packed: tuple[torch.Tensor, int, torch.Tensor] | None = None  # (the weight it was made from, its version, copy)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> OneDNNLinear:
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        layer.weight, layer.bias = linear.weight, linear.bias
        if layer.weight.dtype == torch.float32 and layer.weight.device.type == "cpu":
            layer.packed_weight()  # at load time, not in the first prompt's time to first token
        return layer

    def packed_weight(self) -> torch.Tensor:
        """The weight in oneDNN's blocked layout (an opaque mkldnn tensor, so not a buffer: it is never saved)."""
        weight, packed = self.weight, self._packed
        if packed is None or packed[0] is not weight or packed[1] != weight._version:
            packed = (weight, weight._version, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_ROWS))
            self._packed = packed
        return packed[2]

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles leave the packed weight out (oneDNN's opaque tensors can be neither); they make their
        own when they first multiply."""
        state = self.__dict__.copy()
        state.pop("_packed", None)
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if x.dtype != torch.float32 or self.weight.dtype != torch.float32 or x.device.type != "cpu" or needs_grad:
            return super().forward(x)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(), self.bias, "none", [], "")


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored as int8 (out, in) times a per-row scale (out,).

    On CPU the product runs in torch's fused int8-weight kernel (`aten._weight_int8pack_mm`) for a few rows;
    for many rows, and off the CPU, it dequantizes and calls F.linear (`reference_forward`), which computes the
    same thing up to rounding.
    """

    weight_int8: torch.Tensor
    scale: torch.Tensor

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("weight_int8", weight_int8)  # (out, in) int8
        self.register_buffer("scale", scale)  # (out,) in the activations' dtype
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        # Many rows at once (a prefill, an evaluation batch) run faster as one bfloat16 matmul over the weight
        # dequantized on the fly (AMX / oneDNN) than in the int8 kernel, which is made for a few rows. Measured on a
        # 2-core AMD EPYC (benchmarks/inference/prefill_crossover.py): break-even near 32 rows for a block's layers,
        # near 256 for the 50257-row LM head, whose dequantized copy alone takes tens of milliseconds to write.
        self.dequantize_from_rows = 32 if weight_int8.numel() <= INT8_LARGE_WEIGHT else 256

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, dtype: torch.dtype | None = None) -> Int8Linear:
        weight_int8, scale = quantize_int8_rows(linear.weight)  # (out, in) int8, (out,)
        dtype = dtype or linear.weight.dtype
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(weight_int8, scale.to(dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if x.device.type != "cpu" or rows >= self.dequantize_from_rows:
            return self.reference_forward(x)
        shape = x.shape
        x2d = x.reshape(-1, shape[-1]).to(self.scale.dtype).contiguous()  # (B*T, in): the kernel wants 2-D
        y = torch.ops.aten._weight_int8pack_mm(x2d, self.weight_int8, self.scale)  # (B*T, out)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], -1)

    def reference_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The plain path: dequantize, then an ordinary linear layer."""
        weight = self.weight_int8.to(self.scale.dtype) * self.scale[:, None]
        return F.linear(x.to(self.scale.dtype), weight, self.bias)

    def extra_repr(self) -> str:
        out_features, in_features = self.weight_int8.shape
        return f"in_features={in_features}, out_features={out_features}, bias={self.bias is not None}, int8"


def quantize_int8(model: nn.Module, *, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """Cast `model` to `dtype` and replace every nn.Linear (LM head included) by an Int8Linear, in place.
    For inference only (no gradients flow into int8 weights). Returns the model."""
    model.to(dtype)
    return _replace_linears(model, lambda linear: Int8Linear.from_linear(linear, dtype=dtype))


class Int4Linear(nn.Module):
    """y = x W^T + b with W stored as 4-bit codes q (0..15) in groups of `group_size` inputs, each group with a
    scale s and minimum m: W[o, i] = q[o, i] * s[g, o] + m[g, o] for g = i // group_size (`quantize_groups`).

    torch's CPU kernel takes the pair as scale and zero = m + 8 s, and computes (q - 8) * scale + zero: the same
    weight. `dequantize` gives the weight back for the reference path in tests.
    """

    weight_packed: torch.Tensor
    scales_and_zeros: torch.Tensor

    def __init__(
        self,
        weight_packed: torch.Tensor,
        scales_and_zeros: torch.Tensor,
        bias: torch.Tensor | None,
        group_size: int,
        out_features: int,
    ) -> None:
        super().__init__()
        self.register_buffer("weight_packed", weight_packed)  # (out padded, in / 2) uint8, the kernel's layout
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # (in / group_size, out padded, 2)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.group_size = group_size
        self.out_features = out_features  # the kernel wants a multiple of 16 rows: extra zero rows are cut off

    @staticmethod
    def quantize_groups(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes (out, in) int32 in 0..15, scale (in / group_size, out), minimum (same)) of an (out, in) weight."""
        out_features, in_features = weight.shape
        groups = weight.detach().float().reshape(out_features, in_features // group_size, group_size)
        minimum, maximum = groups.amin(dim=-1), groups.amax(dim=-1)  # (out, G)
        scale = ((maximum - minimum) / INT4_LEVELS).clamp(min=1e-12)
        codes = torch.round((groups - minimum[..., None]) / scale[..., None]).clamp(0, INT4_LEVELS)
        return codes.reshape(out_features, in_features).to(torch.int32), scale.T.contiguous(), minimum.T.contiguous()

    @staticmethod
    def dequantize(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
        """The (out, in) float32 weight that `quantize_groups`' output stands for."""
        out_features, in_features = codes.shape
        groups = codes.float().reshape(out_features, scale.shape[0], -1)  # (out, G, group_size)
        return (groups * scale.T[..., None] + minimum.T[..., None]).reshape(out_features, in_features)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, *, group_size: int = INT4_GROUP_SIZE, dtype: torch.dtype = torch.bfloat16
    ) -> Int4Linear:
        in_features = linear.in_features
        if in_features % group_size or in_features % INT4_K_MULTIPLE:
            raise ValueError(
                f"int4 needs in_features divisible by {group_size} and {INT4_K_MULTIPLE}, got {in_features}"
            )
        out_features = linear.out_features
        weight = F.pad(linear.weight.detach(), (0, 0, 0, -out_features % INT4_N_MULTIPLE))  # (out padded, in)
        codes, scale, minimum = cls.quantize_groups(weight, group_size)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INT4_INNER_K_TILES)
        zero = minimum + 8 * scale  # the kernel subtracts 8 from each code
        scales_and_zeros = torch.stack([scale, zero], dim=-1).to(dtype)  # (G, out, 2)
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(packed, scales_and_zeros, bias, group_size, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2d = x.reshape(-1, shape[-1]).to(self.scales_and_zeros.dtype).contiguous()  # (B*T, in)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2d, self.weight_packed, self.group_size, self.scales_and_zeros)
        y = y[:, : self.out_features]  # (B*T, out)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        out_features = self.out_features
        in_features = self.scales_and_zeros.shape[0] * self.group_size
        bias = self.bias is not None
        return f"in_features={in_features}, out_features={out_features}, bias={bias}, int4 x {self.group_size}"


def quantize_int4(
    model: nn.Module, *, group_size: int = INT4_GROUP_SIZE, dtype: torch.dtype = torch.bfloat16
) -> nn.Module:
    """Cast `model` to `dtype` and replace every nn.Linear (LM head included) by an Int4Linear, in place. CPU
    only (the packed layout is the CPU kernel's); for inference only. Returns the model."""
    model.to(dtype)
    return _replace_linears(model, lambda linear: Int4Linear.from_linear(linear, group_size=group_size, dtype=dtype))


def layout_dtype() -> torch.dtype:
    """The activations' dtype of the int8 / int4 PyTorch layouts on this CPU: bfloat16 where its bfloat16
    products are fast, else float32 (module docstring)."""
    return torch.bfloat16 if cpu_prefers_bf16() else torch.float32


class SplitLinear(nn.Module):
    """y = x W^T + b with W^T stored as `parts` column blocks: (parts, in, out/parts), padded when `parts` does
    not divide `out`. One batched matmul over the blocks lets every core stream its own share of the weight."""

    weight_blocks: torch.Tensor
    bias_blocks: torch.Tensor

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, parts: int) -> None:
        super().__init__()
        out_features, in_features = weight.shape
        per_part = -(-out_features // parts)
        padding = per_part * parts - out_features
        blocks = F.pad(weight.detach(), (0, 0, 0, padding)).view(parts, per_part, in_features)
        self.register_buffer("weight_blocks", blocks.transpose(1, 2).contiguous())  # (parts, in, per_part)
        bias = torch.zeros(out_features, dtype=weight.dtype, device=weight.device) if bias is None else bias.detach()
        self.register_buffer("bias_blocks", F.pad(bias, (0, padding)).view(parts, 1, per_part))
        self.out_features = out_features

    @classmethod
    def from_linear(cls, linear: nn.Linear, parts: int) -> SplitLinear:
        return cls(linear.weight, linear.bias, parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        parts = self.weight_blocks.shape[0]
        rows = x.reshape(1, -1, shape[-1]).expand(parts, -1, -1)  # (parts, N, in), no copy
        y = torch.baddbmm(self.bias_blocks, rows, self.weight_blocks)  # (parts, N, per_part)
        y = y.transpose(0, 1).reshape(rows.shape[1], -1)[:, : self.out_features]  # blocks side by side: (N, out)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        parts, in_features, _ = self.weight_blocks.shape
        return f"in_features={in_features}, out_features={self.out_features}, parts={parts}"


def _replace_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> nn.Module:
    """Swap every nn.Linear of `model` (the tied LM head included) for `make(linear)`, in place."""
    replacements = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for name, linear in replacements:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(linear))
    return model


def optimize_for_inference(model: nn.Module, *, parts: int | None = None) -> nn.Module:
    """Put an fp32 model's linear layers in the split layout for fast CPU decoding (in place; returns the model,
    in eval mode). `parts` defaults to twice the torch thread count. On a GPU this changes nothing: its matrix-
    vector kernels already use the whole device."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        return model.eval()
    parts = parts or max(2, 2 * torch.get_num_threads())
    return _replace_linears(model.eval(), lambda linear: SplitLinear.from_linear(linear, parts))


PRECISIONS = ("float32", "bfloat16", "float16", "int8", "int4")
"""What `prepare_for_inference` accepts: float32, bfloat16/float16 (weights cast), int8 (int8 weights), int4 (4-bit
weights in groups of 32, asymmetric; CPU only)."""


def pack_weights(model: nn.Module, precision: str) -> nn.Module:
    """Cast `model` to bfloat16 and replace every nn.Linear (LM head included) by a `NativeLinear` holding
    bfloat16, int8 or int4 weights for the native kernels, in place. CPU only, for inference only. Returns the
    model."""
    model.to(torch.bfloat16)
    return _replace_linears(model, lambda linear: NativeLinear.from_linear(linear, precision))


def prepare_for_inference(model: M, precision: str = "float32") -> M:
    """The fastest correct inference form of `model` at `precision` (in place; returns it in eval mode), as
    `gpt2 sample`, the server and `gpt2 eval --dtype` use it (module docstring). float16 on a CPU is refused: it
    is slow or unsupported there."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    device = next(model.parameters()).device
    if precision == "float16" and device.type == "cpu":
        raise ValueError("float16 is slow or unsupported on CPU; use bfloat16 or int8 there")
    if precision == "int4" and device.type != "cpu":
        raise ValueError(f"int4 is a CPU layout; on {device.type} use bfloat16 or int8")
    model.eval()
    native = device.type == "cpu" and _all_linears_packable(model) and use_native_kernels()
    if native and precision != "float32":
        pack_weights(model, precision)
    elif precision == "int8":
        quantize_int8(model, dtype=layout_dtype())
    elif precision == "int4":
        quantize_int4(model, dtype=layout_dtype())
    elif precision == "float32":
        if not native:
            optimize_for_inference(model)  # same logits; all cores stream the weights
        elif onednn_available():
            _replace_linears(model, OneDNNLinear.from_linear)  # decode steps still run in the native decoder
    else:
        model.to(torch.bfloat16 if precision == "bfloat16" else torch.float16)
    return model


def _all_linears_packable(model: nn.Module) -> bool:
    """The native kernels read inputs in blocks of 32: every linear layer needs in_features divisible by 32."""
    return all(module.in_features % BLOCK == 0 for module in model.modules() if isinstance(module, nn.Linear))
