"""LoRA (Hu et al. 2021): low-rank adapters beside frozen linear layers, saved and loaded in PEFT's format.

A wrapped layer computes base(x) + scaling * B(A(dropout(x))) with A: (r, in), B: (out, r), scaling = alpha / r
(alpha / sqrt(r) with rsLoRA). B starts at zero, so a fresh adapter changes nothing. Only A and B train.

Saved and read in PEFT's format (adapter_config.json + adapter_model.safetensors, HF's module names;
gpt2.weights.adapters reads them for inference and describes the keys).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save

from gpt2.model import GPT
from gpt2.runtime.files import atomic_write_bytes, atomic_write_text
from gpt2.weights.adapters import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_SUBDIRECTORY,
    ADAPTER_WEIGHTS_FILE,
    PEFT_PREFIX,
    LoRAConfig,
    adapter_directory,
    read_lora_adapter,
)


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update."""

    def __init__(self, base: nn.Linear, config: LoRAConfig) -> None:
        super().__init__()
        self.base = base
        self.scaling = config.scaling
        self.lora_dropout = nn.Dropout(config.dropout)
        self.lora_A = nn.Parameter(torch.empty(config.rank, base.in_features, device=base.weight.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, config.rank, device=base.weight.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # PEFT's default initialization of A
        base.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, T, in) -> (B, T, out)
        update = self.lora_dropout(x) @ self.lora_A.T @ self.lora_B.T
        return self.base(x) + self.scaling * update

    def merged(self) -> nn.Linear:
        """The base layer with the update folded in: W + scaling * B @ A (both [out, in])."""
        with torch.no_grad():
            self.base.weight += self.scaling * (self.lora_B @ self.lora_A).to(self.base.weight.dtype)
        self.base.requires_grad_(True)
        return self.base


def _targets(model: nn.Module, config: LoRAConfig) -> list[tuple[nn.Module, str, nn.Linear]]:
    found = []
    for module in model.modules():
        for name, child in module.named_children():
            if name in config.target_modules and isinstance(child, nn.Linear):
                found.append((module, name, child))
    return found


def add_lora(model: GPT, config: LoRAConfig) -> GPT:
    """Freeze `model` and wrap its target layers with adapters (in place); returns it. A target module that names no
    linear layer is a ValueError, as PEFT's: an adapter without it would train and save nothing for it (a model
    prepared for inference keeps some layers in other forms: load it with gpt2.weights.load_model)."""
    targets = _targets(model, config)
    missing = sorted(set(config.target_modules) - {name for _, name, _ in targets})
    if missing:
        raise ValueError(
            f"the LoRA target modules {', '.join(missing)} are no linear layers of this model (a model prepared for "
            "inference keeps them in other forms: load it with gpt2.weights.load_model)"
        )
    model.requires_grad_(False)
    for parent, name, linear in targets:
        setattr(parent, name, LoRALinear(linear, config))
    return model


def merge_lora(model: GPT) -> GPT:
    """Fold every adapter into its layer (in place): a plain GPT computing the same function; returns it."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.merged())
    return model


def find_adapter(directory: str | os.PathLike[str], model: str | os.PathLike[str] | None = None) -> Path:
    """The adapter folder `directory` names: itself when it holds adapter_config.json, else its `adapter/`
    (where `gpt2 finetune --method lora` writes it, beside the merged model). With `model` (what the adapter will be
    applied to): refused when that is the merged output of this very adapter, which would apply it twice."""
    folder = adapter_directory(directory)
    if model is None:
        return folder
    beside = Path(model) / ADAPTER_SUBDIRECTORY / ADAPTER_WEIGHTS_FILE
    mine = folder / ADAPTER_WEIGHTS_FILE
    if beside.is_file() and mine.is_file() and _same_bytes(beside, mine):
        raise ValueError(
            f"{model} already has the adapter {folder} merged into its weights (a LoRA `gpt2 finetune` writes the "
            f"merged model and {ADAPTER_SUBDIRECTORY}/ beside it); drop --adapter, or pass the base model as --model"
        )
    return folder


def _same_bytes(first: Path, second: Path) -> bool:
    return first.stat().st_size == second.stat().st_size and first.read_bytes() == second.read_bytes()


def apply_adapter(model: GPT, directory: str | os.PathLike[str]) -> GPT:
    """`model` with the PEFT adapter in `directory` loaded and merged in (in place): a plain GPT; returns it."""
    load_adapter(model, directory)
    return merge_lora(model)


def lora_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The adapters under PEFT's key names for GPT2LMHeadModel."""
    tensors = {}
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = module.lora_A.detach().contiguous()
            tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = module.lora_B.detach().contiguous()
    return tensors


def save_adapter(model: GPT, config: LoRAConfig, directory: str | os.PathLike[str], base_model: str = "") -> Path:
    """Write adapter_config.json and adapter_model.safetensors as PEFT does; returns the directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    peft_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": config.rank, "lora_alpha": config.alpha, "lora_dropout": config.dropout,
        "target_modules": list(config.target_modules), "fan_in_fan_out": True, "bias": "none",
        "use_rslora": config.use_rslora, "inference_mode": True, "init_lora_weights": True,
        "modules_to_save": None,
    }  # fmt: skip
    # each file atomically: a crash never leaves half an adapter that PEFT would then fail to read
    atomic_write_text(out / ADAPTER_CONFIG_FILE, json.dumps(peft_config, indent=2) + "\n")
    atomic_write_bytes(out / ADAPTER_WEIGHTS_FILE, save(lora_state_dict(model), metadata={"format": "pt"}))
    return out


def load_adapter(model: GPT, directory: str | os.PathLike[str]) -> LoRAConfig:
    """Wrap `model` with the adapters saved in `directory` (PEFT's format) and load their weights, read and
    checked by gpt2.weights.adapters.read_lora_adapter (a ValueError names a misfit before `model` changes)."""
    adapter = read_lora_adapter(directory, model.config, Path(directory).name)
    add_lora(model, adapter.config)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, (a, b) in adapter.layers.items():
            layer = modules[name]
            assert isinstance(layer, LoRALinear), name  # add_lora wraps every layer the adapter's targets name
            layer.lora_A.copy_(a)
            layer.lora_B.copy_(b)
    return adapter.config
