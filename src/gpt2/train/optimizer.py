"""The optimizer and its per-step settings: AdamW (weight decay on the 2-D tensors only, in the fastest
implementation available), or Muon for the transformer blocks' matrices with AdamW for everything else
(`gpt2.train.muon`); `apply_schedule` sets each step's learning rates (and Muon's momentum warmup)."""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn as nn

from gpt2.runtime.device import cpu_prefers_bf16
from gpt2.train.config import OptimizerConfig, TrainConfig
from gpt2.train.muon import MuonAdamW
from gpt2.train.schedule import schedule_at

MUON_MOMENTUM_START = 0.85
"""Muon's momentum at step 0 when muon_momentum_warmup_steps > 0 (modded-nanogpt), rising linearly to
muon_momentum."""
_BLOCK_PARAMETER = re.compile(r"(^|\.)h\.\d+\.")  # transformer.h.N.* (also under wrappers' prefixes)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: the 2-D tensors (matmul weights and embeddings) decay; biases and LayerNorm parameters
    (1-D) do not. Every trainable parameter is in exactly one group (the tied head/embedding once)."""
    params = [p for p in model.parameters() if p.requires_grad]  # parameters() yields a tied tensor once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def muon_parameter_groups(model: nn.Module, config: OptimizerConfig) -> list[dict[str, Any]]:
    """Three groups: Muon for the 2-D weights inside the transformer blocks (attn.c_attn, attn.c_proj, mlp.c_fc,
    mlp.c_proj, and LoRA factors there); AdamW with weight decay for the other 2-D tensors (token and position
    embeddings = the tied head, a classifier head); AdamW without decay for the 1-D ones (biases, LayerNorm)."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]  # a tied tensor once
    muon = [p for name, p in named if p.dim() == 2 and _BLOCK_PARAMETER.search(name)]
    chosen = {id(p) for p in muon}
    rest = [p for _, p in named if id(p) not in chosen]
    adamw = {
        "use_muon": False,
        "max_lr": config.learning_rate,
        "betas": (config.beta1, config.beta2),
        "eps": config.eps,
    }
    groups = [
        {"params": muon, "use_muon": True, "max_lr": config.muon_lr, "lr": config.muon_lr,
         "weight_decay": config.muon_weight_decay, "momentum": config.muon_momentum, "nesterov": True,
         "ns_steps": config.muon_ns_steps},
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": config.weight_decay, **adamw},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0, **adamw},
    ]  # fmt: skip
    return [group for group in groups if group["params"]]


def configure_optimizer(model: nn.Module, config: OptimizerConfig, device: torch.device) -> torch.optim.Optimizer:
    """config.name: 'adamw' = torch.optim.AdamW over `parameter_groups`; 'muon' = MuonAdamW over
    `muon_parameter_groups`. AdamW's implementation is what `config.impl` asks for ('auto': fused on CUDA and
    CPU, else foreach). Under FSDP, build it after sharding: it must hold the sharded parameters."""
    impl = config.impl
    if impl == "auto":
        impl = "fused" if device.type in ("cuda", "cpu") else "foreach"
    if config.name == "muon":
        ns_dtype = config.muon_ns_dtype
        if ns_dtype == "auto":  # bf16 matmuls: fast on CUDA and on some CPUs, elsewhere far slower than fp32
            ns_dtype = "bfloat16" if device.type == "cuda" or cpu_prefers_bf16() else "float32"
        return MuonAdamW(muon_parameter_groups(model, config), ns_dtype=getattr(torch, ns_dtype),
                         compile=config.muon_compile, adamw_impl=impl)  # fmt: skip
    options = {"fused": impl == "fused", "foreach": impl == "foreach"} if impl != "for-loop" else {"foreach": False}
    return torch.optim.AdamW(
        parameter_groups(model, config.weight_decay),
        lr=config.learning_rate,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        **options,
    )


def apply_schedule(optimizer: torch.optim.Optimizer, config: TrainConfig, step: int) -> float:
    """Set every group's LR for optimizer step `step` (0-based): config.schedule.lr_schedule applied to the group's
    peak (`max_lr`: muon_lr for Muon groups; learning_rate otherwise), and Muon's momentum warmup. Returns the
    AdamW learning rate (the one logged)."""
    for group in optimizer.param_groups:
        group["lr"] = schedule_at(config.schedule, step, group.get("max_lr", config.optimizer.learning_rate))
        if group.get("use_muon"):
            group["momentum"] = muon_momentum_at(config.optimizer, step)
    return schedule_at(config.schedule, step, config.optimizer.learning_rate)


def muon_momentum_at(config: OptimizerConfig, step: int) -> float:
    """Muon's momentum at `step`: MUON_MOMENTUM_START rising linearly to muon_momentum over
    muon_momentum_warmup_steps, then constant."""
    warmup = config.muon_momentum_warmup_steps
    if step >= warmup:
        return config.muon_momentum
    return MUON_MOMENTUM_START + (config.muon_momentum - MUON_MOMENTUM_START) * step / warmup
