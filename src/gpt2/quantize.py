"""Weight-only int8 quantization for inference: fewer bytes per decoded token.

Decoding one token reads every weight once (~500 MB in fp32 for the 124M model), so at small batch sizes a
CPU decodes at memory-bandwidth speed and the bytes per weight set the pace. `quantize_int8` stores each
linear layer's weight as int8 with one scale per output row (symmetric, absmax / 127) and keeps activations
in the model's dtype (bfloat16 is what torch's CPU int8 kernel is fast with). Embeddings, LayerNorms and
biases stay as they are; the tied LM head gets its own int8 copy while `wte` keeps serving the lookups.

The accuracy cost is measured in benchmarks/bench_generate.py and docs/benchmarks.md ("## Generation").
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

INT8_MAX = 127


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored as int8 (out, in) times a per-row scale (out,).

    On CPU the product runs in torch's fused int8-weight kernel (`aten._weight_int8pack_mm`); elsewhere it
    dequantizes and calls F.linear (`reference_forward`), which computes the same thing.
    """

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("weight_int8", weight_int8)  # (out, in) int8
        self.register_buffer("scale", scale)  # (out,) in the activations' dtype
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, dtype: torch.dtype | None = None) -> "Int8Linear":
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / INT8_MAX  # (out,)
        weight_int8 = torch.round(weight / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        dtype = dtype or linear.weight.dtype
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(weight_int8, scale.to(dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
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
    replacements = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for name, linear in replacements:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Int8Linear.from_linear(linear, dtype=dtype))
    return model

