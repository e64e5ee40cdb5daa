"""LoRA (Hu et al. 2021): low-rank adapters beside frozen linear layers, saved and loaded in PEFT's format.

A wrapped layer computes base(x) + scaling * B(A(dropout(x))) with A: (r, in), B: (out, r), scaling = alpha / r
(alpha / sqrt(r) with rsLoRA). B starts at zero, so a fresh adapter changes nothing. Only A and B train.

PEFT's files for GPT2LMHeadModel: adapter_config.json and adapter_model.safetensors with keys such as
`base_model.model.transformer.h.0.attn.c_attn.lora_A.weight`. HF GPT-2's layers are Conv1D ([in, out] weights,
`fan_in_fan_out=True`), but PEFT's lora_A / lora_B are plain Linear layers ([r, in], [out, r]) either way, so
they are our A and B as they are; our module names are HF's.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors.torch import load_file, save

from gpt2.model import GPT
from gpt2.runtime.files import atomic_write_bytes, atomic_write_text

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
MERGED_ADAPTER_DIR = "adapter"  # where a LoRA fine-tune writes its adapter, beside the merged model
PEFT_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the wrapped GPT2LMHeadModel
TARGETABLE = ("c_attn", "c_proj", "c_fc")


@dataclass(frozen=True)
class LoRAConfig:
    """Where and how big the adapters are."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.05
    target_modules: tuple[str, ...] = ("c_attn",)
    """Layer names adapted, among c_attn (q, k, v), c_proj (attention and MLP output), c_fc (MLP input)."""
    use_rslora: bool = False
    """Scale by alpha / sqrt(rank) instead of alpha / rank."""

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, str):
            object.__setattr__(self, "target_modules", tuple(t for t in self.target_modules.split(",") if t))
        if self.rank < 1:
            raise ValueError(f"lora rank must be a positive integer, got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")
        unknown = [name for name in self.target_modules if name not in TARGETABLE]
        if unknown or not self.target_modules:
            raise ValueError(f"lora target_modules {list(self.target_modules)} must be some of {TARGETABLE}")

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


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
    """Freeze `model` and wrap its target layers with adapters (in place); returns it."""
    model.requires_grad_(False)
    for parent, name, linear in _targets(model, config):
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
    (where `gpt2 finetune --lora` writes it, beside the merged model). With `model` (what the adapter will be
    applied to): refused when that is the merged output of this very adapter, which would apply it twice."""
    folder = Path(directory)
    if not (folder / ADAPTER_CONFIG_FILE).is_file() and (folder / MERGED_ADAPTER_DIR / ADAPTER_CONFIG_FILE).is_file():
        folder = folder / MERGED_ADAPTER_DIR
    if model is None:
        return folder
    beside = Path(model) / MERGED_ADAPTER_DIR / ADAPTER_WEIGHTS_FILE
    mine = folder / ADAPTER_WEIGHTS_FILE
    if beside.is_file() and mine.is_file() and _same_bytes(beside, mine):
        raise ValueError(
            f"{model} already has the adapter {folder} merged into its weights (`gpt2 finetune --lora` writes the "
            f"merged model and {MERGED_ADAPTER_DIR}/ beside it); drop --adapter, or pass the base model as --model"
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


def read_adapter_config(directory: str | os.PathLike[str]) -> LoRAConfig:
    """The LoRAConfig of a PEFT adapter directory (ours or PEFT's)."""
    path = Path(directory) / ADAPTER_CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a folder saved by PEFT or `gpt2 finetune --lora`")
    values: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if values.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: peft_type {values.get('peft_type')!r} is not supported; only LORA adapters")
    targets = values.get("target_modules") or ["c_attn"]
    if isinstance(targets, str):
        raise ValueError(f"{path}: target_modules as a pattern ({targets!r}) is not supported; list the names")
    return LoRAConfig(rank=int(values["r"]), alpha=float(values.get("lora_alpha", 8)),
                      dropout=float(values.get("lora_dropout", 0.0)), target_modules=tuple(targets),
                      use_rslora=bool(values.get("use_rslora", False)))  # fmt: skip


def load_adapter(model: GPT, directory: str | os.PathLike[str]) -> LoRAConfig:
    """Wrap `model` with the adapters saved in `directory` (PEFT's format) and load their weights."""
    config = read_adapter_config(directory)
    add_lora(model, config)
    tensors = load_file(str(Path(directory) / ADAPTER_WEIGHTS_FILE))
    expected = lora_state_dict(model)
    # PEFT may write the adapter name into keys (`lora_A.default.weight`) in some versions: accept both
    tensors = {key.replace(".default.weight", ".weight"): value for key, value in tensors.items()}
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"{directory}: the adapter lacks {len(missing)} tensors, e.g. {missing[0]}")
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, module in modules.items():
            if isinstance(module, LoRALinear):
                module.lora_A.copy_(tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"])
                module.lora_B.copy_(tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"])
    return config
