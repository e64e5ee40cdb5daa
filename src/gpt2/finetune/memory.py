"""Will a training run fit? Bytes of weights, gradients, optimizer state and activations, before allocating any.

The estimate counts what a training step of our GPT keeps alive at its peak (the start of backward):

- weights: every parameter in float32 (the Trainer keeps parameters fp32 under autocast), plus, under a 16-bit
  autocast, the half-precision copies autocast caches for the step;
- gradients: float32, one per trainable parameter (all of them, or only the LoRA adapters);
- optimizer state: AdamW keeps two float32 moments per trainable parameter, SGD with momentum one;
- runtime: a fixed allowance for the framework's own buffers;
- activations of one micro-batch, per token: each block keeps 16 C-wide tensors for backward (ln_1 and ln_2
  inputs in fp32, the residual stream; ln_1 out, q k v, attention out, ln_2 out, the 4C MLP input and GELU output
  in the compute dtype); with activation checkpointing only each block's input plus one block being recomputed.
  The LM head keeps the logits' log-softmax in fp32 and, in backward, two more V-wide fp32 tensors (the gradient
  and its result), which at GPT-2's vocabulary is as much as all twelve blocks.

Attention uses the fused kernels (no (T, T) matrix is stored). `auto_batch_size` turns the estimate around: the
largest micro-batch that fits a budget, and the gradient-accumulation steps that keep the global batch.

    >>> from gpt2.config import GPTConfig
    >>> estimate = estimate_memory(GPTConfig.from_name("gpt2"), 8, 1024, dtype=torch.bfloat16)
    >>> round(estimate.total / 2**30, 1)
    10.1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from gpt2.config import GPTConfig

Optimizer = Literal["adamw", "sgd"]
FP32_BYTES = 4
# Optimizer state per trainable parameter, in float32 values: AdamW's exp_avg and exp_avg_sq; SGD's momentum.
OPTIMIZER_STATES = {"adamw": 2, "sgd": 1}
# Per token and block: C-wide tensors kept for backward in fp32 (ln_1 and ln_2 inputs: the residual stream)...
BLOCK_FP32_WIDTHS = 2
# ...and in the compute dtype: ln_1 out (1) + q,k,v (3) + attention out (1) + ln_2 out (1) + MLP 4C in, GELU out (8).
BLOCK_COMPUTE_WIDTHS = 14
# V-wide fp32 tensors of the LM head at the start of backward: log-softmax output, its gradient, the logits' gradient.
HEAD_FP32_VOCAB_WIDTHS = 3
# What PyTorch's CPU kernels allocate on first use whatever the model's size (thread pools, BLAS/oneDNN workspaces):
# ~60-80 MB measured on the first training step of models from 5M to 17M parameters (tests/test_memory.py).
RUNTIME_OVERHEAD_BYTES = 64 * 2**20

GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one training process needs at its peak; `total` is what must fit."""

    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    """Of one micro-batch, with the activation_checkpointing the estimate was made for."""
    activations_without_checkpointing: int
    activations_with_checkpointing: int
    batch_size: int
    block_size: int
    activation_checkpointing: bool
    runtime: int = RUNTIME_OVERHEAD_BYTES
    """The framework's own buffers, independent of the model (see RUNTIME_OVERHEAD_BYTES)."""

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer_state + self.activations + self.runtime

    def describe(self) -> str:
        return (
            f"{self.total / GIB:.2f} GiB (weights {self.weights / GIB:.2f}, gradients {self.gradients / GIB:.2f}, "
            f"optimizer state {self.optimizer_state / GIB:.2f}, activations {self.activations / GIB:.2f} for "
            f"batch_size {self.batch_size} x block_size {self.block_size}"
            f"{', activation checkpointing' if self.activation_checkpointing else ''})"
        )


def parameter_count(config: GPTConfig) -> int:
    """GPT-2's parameters (the LM head tied to wte): embeddings, 12C^2 + 13C per block (biases included), ln_f."""
    C, V, L = config.n_embd, config.vocab_size, config.n_layer
    per_block = 12 * C * C + (13 * C if config.bias else 2 * C)  # without biases only the LayerNorm gains (2C) stay
    return V * C + config.block_size * C + L * per_block + (2 * C if config.bias else C)


def estimate_memory(
    model_config: GPTConfig,
    batch_size: int,
    block_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    optimizer: Optimizer = "adamw",
    lora_params: int | None = None,
    activation_checkpointing: bool = False,
) -> MemoryEstimate:
    """The peak bytes of training `model_config` on micro-batches of batch_size x block_size tokens.

    dtype: the compute (autocast) dtype; parameters stay float32. lora_params: trainable adapter parameters when
    only they train (the base model frozen: no gradients or optimizer state for it)."""
    if batch_size < 1 or block_size < 1:
        raise ValueError(f"batch_size and block_size must be positive, got {batch_size} and {block_size}")
    if block_size > model_config.block_size:
        raise ValueError(f"block_size {block_size} exceeds the model's {model_config.block_size} positions")
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {sorted(OPTIMIZER_STATES)}")
    if lora_params is not None and lora_params < 0:
        raise ValueError(f"lora_params must be a non-negative count, got {lora_params}")
    compute_bytes = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else FP32_BYTES
    params = parameter_count(model_config)
    trainable = params if lora_params is None else lora_params
    weights = (params + (lora_params or 0)) * FP32_BYTES
    if compute_bytes < FP32_BYTES:
        weights += params * compute_bytes  # autocast's per-step cache of low-precision weight copies

    C, V, L = model_config.n_embd, model_config.vocab_size, model_config.n_layer
    tokens = batch_size * block_size
    block = BLOCK_FP32_WIDTHS * C * FP32_BYTES + BLOCK_COMPUTE_WIDTHS * C * compute_bytes  # per token, one block
    head = C * FP32_BYTES + C * compute_bytes + HEAD_FP32_VOCAB_WIDTHS * V * FP32_BYTES  # ln_f in/out, the V-wide
    if compute_bytes < FP32_BYTES:
        head += V * compute_bytes  # the low-precision logits, upcast for the loss
    full = tokens * (L * block + head)
    # checkpointed: each block's input (the fp32 residual stream) + one block's activations while it is recomputed
    checkpointed = tokens * (L * C * FP32_BYTES + block + head)
    return MemoryEstimate(
        weights=weights,
        gradients=trainable * FP32_BYTES,
        optimizer_state=trainable * OPTIMIZER_STATES[optimizer] * FP32_BYTES,
        activations=checkpointed if activation_checkpointing else full,
        activations_without_checkpointing=full,
        activations_with_checkpointing=checkpointed,
        batch_size=batch_size,
        block_size=block_size,
        activation_checkpointing=activation_checkpointing,
    )


def check_fits(estimate: MemoryEstimate, budget_bytes: int) -> None:
    """ValueError naming the estimate, the budget and the ways out when the run would not fit."""
    if estimate.total <= budget_bytes:
        return
    fixes = ["lower batch_size (raise grad_accum_steps to keep the global batch)"]
    if not estimate.activation_checkpointing:
        fixes.append(
            f"set activation_checkpointing=True (activations {estimate.activations_with_checkpointing / GIB:.2f} GiB)"
        )
    fixes.append("train LoRA adapters instead of every weight")
    raise ValueError(
        f"training needs about {estimate.describe()} but the memory budget is {budget_bytes / GIB:.2f} GiB: "
        + "; or ".join(fixes)
    )


@dataclass(frozen=True)
class BatchPlan:
    """A micro-batch that fits, and the accumulation that keeps the global batch:
    batch_size * grad_accum_steps * world_size == global_batch_size."""

    batch_size: int
    grad_accum_steps: int
    estimate: MemoryEstimate


def auto_batch_size(
    model_config: GPTConfig,
    block_size: int,
    budget_bytes: int,
    *,
    global_batch_size: int,
    world_size: int = 1,
    dtype: torch.dtype = torch.float32,
    optimizer: Optimizer = "adamw",
    lora_params: int | None = None,
    activation_checkpointing: bool = False,
) -> BatchPlan:
    """The largest micro-batch (sequences per process) that fits `budget_bytes` and divides the global batch
    exactly, with its gradient-accumulation steps. ValueError (see check_fits) when not even one sequence fits.

    >>> from gpt2.config import GPTConfig
    >>> plan = auto_batch_size(GPTConfig.from_name("gpt2"), 1024, 16 * GIB, global_batch_size=64, dtype=torch.bfloat16)
    >>> plan.batch_size, plan.grad_accum_steps
    (8, 8)
    """
    if global_batch_size < 1 or world_size < 1 or global_batch_size % world_size:
        raise ValueError(
            f"global_batch_size ({global_batch_size}) must be a positive multiple of world_size ({world_size})"
        )
    per_process = global_batch_size // world_size

    def estimate(batch_size: int) -> MemoryEstimate:
        return estimate_memory(model_config, batch_size, block_size, dtype=dtype, optimizer=optimizer,
                               lora_params=lora_params, activation_checkpointing=activation_checkpointing)  # fmt: skip

    for batch_size in sorted((d for d in range(1, per_process + 1) if per_process % d == 0), reverse=True):
        candidate = estimate(batch_size)
        if candidate.total <= budget_bytes:
            return BatchPlan(batch_size, per_process // batch_size, candidate)
    check_fits(estimate(1), budget_bytes)  # raises: not even one sequence fits
    raise AssertionError("unreachable: batch_size 1 fits but was not chosen")
