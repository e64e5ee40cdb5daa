"""LoRA adapters in PEFT's format: the config, and the low-rank weights read and checked against the base model
they will run on (for inference, gpt2.inference.lora_batch; for llama.cpp, gpt2.export.gguf_lora).

PEFT's files for GPT2LMHeadModel: adapter_config.json and adapter_model.safetensors with keys such as
`base_model.model.transformer.h.0.attn.c_attn.lora_A.weight`. HF GPT-2's layers are Conv1D ([in, out] weights,
`fan_in_fan_out=True`), but PEFT's lora_A / lora_B are plain Linear layers ([r, in], [out, r]) either way, so
they are our A and B as they are; our module names are HF's. A layer with an adapter computes
base(x) + scaling * (x A^T) B^T, scaling = alpha / r (alpha / sqrt(r) with rsLoRA).

`gpt2 finetune --lora` writes these files (gpt2.finetune.lora) under OUT/adapter; `read_lora_adapter` takes that
folder, the fine-tune's OUT folder itself, or what PEFT's `save_pretrained` writes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from gpt2.config import GPTConfig

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_SUBDIRECTORY = "adapter"  # where `gpt2 finetune --lora` writes the adapter inside its output folder
PEFT_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the wrapped GPT2LMHeadModel
TARGETABLE = ("c_attn", "c_proj", "c_fc")
# PEFT config keys that change what the adapter computes in ways we do not implement: refused, not ignored.
UNSUPPORTED_WHEN_SET = ("rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform", "use_dora")


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


def adapter_directory(path: str | os.PathLike[str]) -> Path:
    """The folder holding adapter_config.json: `path` itself, or its `adapter/` (a `gpt2 finetune --lora` run)."""
    folder = Path(path).expanduser()
    if not (folder / ADAPTER_CONFIG_FILE).is_file() and (folder / ADAPTER_SUBDIRECTORY / ADAPTER_CONFIG_FILE).is_file():
        return folder / ADAPTER_SUBDIRECTORY
    return folder


def read_adapter_config(directory: str | os.PathLike[str]) -> LoRAConfig:
    """The LoRAConfig of a PEFT adapter directory (ours or PEFT's)."""
    path = Path(directory) / ADAPTER_CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a folder saved by PEFT or `gpt2 finetune --lora`")
    try:
        values: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); save the adapter again") from error
    if values.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: peft_type {values.get('peft_type')!r} is not supported; only LORA adapters")
    targets = values.get("target_modules") or ["c_attn"]
    if isinstance(targets, str):
        raise ValueError(f"{path}: target_modules as a pattern ({targets!r}) is not supported; list the names")
    unsupported = [key for key in UNSUPPORTED_WHEN_SET if values.get(key)]
    if values.get("bias", "none") != "none":
        unsupported.append(f"bias={values['bias']!r}")
    if unsupported:
        raise ValueError(f"{path}: {', '.join(unsupported)} is not supported; train the adapter without it")
    return LoRAConfig(rank=int(values["r"]), alpha=float(values.get("lora_alpha", 8)),
                      dropout=float(values.get("lora_dropout", 0.0)), target_modules=tuple(targets),
                      use_rslora=bool(values.get("use_rslora", False)))  # fmt: skip


def adapted_layer_shapes(config: GPTConfig, targets: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """The (out, in) shape of every layer an adapter on `targets` changes, by module name.

    >>> adapted_layer_shapes(GPTConfig.from_name("gpt2-tiny", vocab_size=100), ("c_fc",))["transformer.h.0.mlp.c_fc"]
    (256, 64)
    """
    C = config.n_embd
    per_block = {"attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "mlp.c_fc": (4 * C, C), "mlp.c_proj": (C, 4 * C)}
    return {
        f"transformer.h.{block}.{name}": shape
        for block in range(config.n_layer)
        for name, shape in per_block.items()
        if name.rpartition(".")[2] in targets
    }


@dataclass(frozen=True)
class LoRAAdapter:
    """One adapter, ready to add to a base model's layers: for each adapted layer (by module name) A (r, in) and
    B (out, r), float32, whose update is scaling * (x A^T) B^T. Holds only its own weights, not the base's."""

    name: str
    config: LoRAConfig
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]]
    source: Path
    key: bytes
    """A digest of what the adapter computes (its scaling, layers, A and B): what the server's prefix cache keys
    the blocks of prompts decoded with it under, so no other adapter (nor one loaded again under this name with
    other weights) reuses them."""

    @property
    def scaling(self) -> float:
        return self.config.scaling

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.layers.values())

    def to(self, device: torch.device) -> LoRAAdapter:
        """The adapter with its weights on `device` (itself when they are there)."""
        if all(a.device == device for a, _ in self.layers.values()):
            return self
        layers = {layer: (a.to(device), b.to(device)) for layer, (a, b) in self.layers.items()}
        return dataclasses.replace(self, layers=layers)


def read_lora_adapter(directory: str | os.PathLike[str], config: GPTConfig, name: str) -> LoRAAdapter:
    """The adapter saved in `directory` (PEFT's format, or a `gpt2 finetune --lora` output folder), checked to fit
    a base model of `config`: every tensor for a layer the base has, of that layer's shape and the config's rank.

    Errors (ValueError) name the first misfit: an adapter for another base (more blocks, another width), another
    rank than its config says, a target module the base lacks, tensors missing."""
    folder = adapter_directory(directory)
    lora = read_adapter_config(folder)
    weights_path = folder / ADAPTER_WEIGHTS_FILE
    if not weights_path.is_file():
        raise FileNotFoundError(f"{weights_path} does not exist; the adapter folder is incomplete, save it again")
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{weights_path} is not a readable safetensors file ({error}); save it again") from error
    shapes = adapted_layer_shapes(config, lora.target_modules)
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        # PEFT may write the adapter name into keys (`lora_A.default.weight`) in some versions: accept both
        layer, _, kind = key.removeprefix(PEFT_PREFIX).replace(".default.weight", ".weight").rpartition(".lora_")
        if layer not in shapes or kind not in ("A.weight", "B.weight"):
            raise ValueError(
                f"{weights_path}: tensor {key} is for no layer this base model adapts ({config.n_layer} blocks, "
                f"targets {list(lora.target_modules)}); the adapter was made for another base model"
            )
        found.setdefault(layer, {})[kind[0]] = tensor
    layers = {}
    for layer, (out_features, in_features) in shapes.items():
        pair = found.get(layer, {})
        if set(pair) != {"A", "B"}:
            raise ValueError(f"{weights_path}: the adapter lacks lora_A or lora_B of {layer}; save it again")
        a, b = pair["A"], pair["B"]
        if a.shape != (lora.rank, in_features) or b.shape != (out_features, lora.rank):
            raise ValueError(
                f"{weights_path}: {layer} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}, but this base "
                f"(n_embd={config.n_embd}) with rank {lora.rank} needs {(lora.rank, in_features)} and "
                f"{(out_features, lora.rank)}; the adapter was made for another base model or rank"
            )
        layers[layer] = (a.float().contiguous(), b.float().contiguous())
    return LoRAAdapter(name=name, config=lora, layers=layers, source=folder, key=_digest(lora.scaling, layers))


def _digest(scaling: float, layers: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> bytes:
    digest = hashlib.blake2b(repr(scaling).encode(), digest_size=16)
    for layer, (a, b) in sorted(layers.items()):
        digest.update(layer.encode())
        digest.update(a.numpy().tobytes())
        digest.update(b.numpy().tobytes())
    return digest.digest()
