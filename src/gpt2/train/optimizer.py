"""The optimizer: AdamW with weight decay on the 2-D tensors only, in the fastest implementation available."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from gpt2.train.config import TrainConfig


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: the 2-D tensors (matmul weights and embeddings) decay; biases and LayerNorm parameters
    (1-D) do not. Every trainable parameter is in exactly one group (the tied head/embedding once)."""
    params = [p for p in model.parameters() if p.requires_grad]  # parameters() yields a tied tensor once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def configure_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over `parameter_groups`, with the implementation `config.optimizer_impl` asks for ('auto': fused
    on CUDA and CPU, else foreach). Under FSDP, build it after sharding: it must hold the sharded parameters."""
    impl = config.optimizer_impl
    if impl == "auto":
        impl = "fused" if device.type in ("cuda", "cpu") else "foreach"
    options = {"fused": impl == "fused", "foreach": impl == "foreach"} if impl != "for-loop" else {"foreach": False}
    return torch.optim.AdamW(
        parameter_groups(model, config.weight_decay),
        lr=config.learning_rate,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        **options,
    )
