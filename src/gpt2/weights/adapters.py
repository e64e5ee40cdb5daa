"""LoRA adapters in PEFT's format: the config, and the low-rank weights read and checked against the base model
they will run on (for inference, gpt2.inference.lora_batch; for llama.cpp, gpt2.export.gguf_lora).

PEFT's files for GPT2LMHeadModel: adapter_config.json and adapter_model.safetensors with keys such as
`base_model.model.transformer.h.0.attn.c_attn.lora_A.weight`. HF GPT-2's layers are Conv1D ([in, out] weights,
`fan_in_fan_out=True`), but PEFT's lora_A / lora_B are plain Linear layers ([r, in], [out, r]) either way, so
they are our A and B as they are; our module names are HF's. A layer with an adapter computes
base(x) + scaling * (x A^T) B^T, scaling = alpha / r (alpha / sqrt(r) with rsLoRA).

`gpt2 finetune --method lora` writes these files (gpt2.finetune.lora) under OUT/adapter; `read_lora_adapter` takes that
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

from gpt2.config import GPTConfig, is_integer

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_SUBDIRECTORY = "adapter"  # where `gpt2 finetune --method lora` writes the adapter inside its output folder
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
    """The folder holding adapter_config.json: `path` itself, or its `adapter/` (a LoRA `gpt2 finetune` run)."""
    folder = Path(path).expanduser()
    if not (folder / ADAPTER_CONFIG_FILE).is_file() and (folder / ADAPTER_SUBDIRECTORY / ADAPTER_CONFIG_FILE).is_file():
        return folder / ADAPTER_SUBDIRECTORY
    return folder


def read_adapter_config(directory: str | os.PathLike[str]) -> LoRAConfig:
    """The LoRAConfig of a PEFT adapter directory (ours or PEFT's), every field checked: a ValueError names the
    file and the field (a list where an object belongs, `"r": 8.9`, `"use_rslora": "false"`)."""
    path = Path(directory) / ADAPTER_CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a folder saved by PEFT or `gpt2 finetune --method lora`")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); save the adapter again") from error
    except OSError as error:
        raise ValueError(f"{path} cannot be read ({error.strerror}); check its permissions") from error
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a JSON object, not a {type(values).__name__}; save the adapter again")
    if values.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: peft_type {values.get('peft_type')!r} is not supported; only LORA adapters")
    unsupported = [key for key in UNSUPPORTED_WHEN_SET if values.get(key)]
    if values.get("bias", "none") != "none":
        unsupported.append(f"bias={values['bias']!r}")
    if unsupported:
        raise ValueError(f"{path}: {', '.join(unsupported)} is not supported; train the adapter without it")
    try:
        return LoRAConfig(rank=_rank(values), alpha=_finite(values, "lora_alpha", 8.0),
                          dropout=_finite(values, "lora_dropout", 0.0), target_modules=_targets(values),
                          use_rslora=_flag(values, "use_rslora"))  # fmt: skip
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from error


# The field checks of adapter_config.json: each error names the field as the file spells it (the caller adds the
# file). JSON's numbers arrive as int or float (1e999 as inf), and Python's bool is an int, so each type is named.
def _rank(values: dict[str, Any]) -> int:
    if "r" not in values:
        raise ValueError("the field r (the adapter's rank) is missing; save the adapter again")
    rank = values["r"]
    if not is_integer(rank) or rank < 1:
        raise ValueError(f"r must be a positive integer, got {rank!r}; save the adapter again")
    return rank


def _finite(values: dict[str, Any], field: str, default: float) -> float:
    value = values.get(field, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, got {value!r}; save the adapter again")
    return float(value)


def _targets(values: dict[str, Any]) -> tuple[str, ...]:
    targets = values.get("target_modules")
    if targets is None:
        return ("c_attn",)  # PEFT's default for GPT-2 when the field is null
    if isinstance(targets, str):
        raise ValueError(f"target_modules as a pattern ({targets!r}) is not supported; list the names")
    if not isinstance(targets, list) or not all(isinstance(target, str) for target in targets):
        raise ValueError(f"target_modules must be a list of layer names such as ['c_attn'], got {targets!r}")
    return tuple(targets)


def _flag(values: dict[str, Any], field: str) -> bool:
    value = values.get(field, False)
    if not isinstance(value, bool):
        raise ValueError(f"{field} must be true or false, got {value!r}; save the adapter again")
    return value


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
    """The folder the adapter was read from (`adapter/` inside a `gpt2 finetune --method lora` output folder)."""
    given: str
    """The path as the caller named it: what the server shows as the adapter's root, so its answers name only
    paths the client or the command line gave."""
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


def read_lora_adapter(
    directory: str | os.PathLike[str], config: GPTConfig, name: str, *, max_rank: int | None = None
) -> LoRAAdapter:
    """The adapter saved in `directory` (PEFT's format, or a LoRA `gpt2 finetune` output folder), checked to fit
    a base model of `config`: every tensor for a layer the base has, of that layer's shape and the config's rank,
    and finite. The one reader of adapters from disk (the CLI, `LLM.load(adapters=)`, the server, the exports).

    Errors (ValueError) name the file and the first misfit: a config field of the wrong type, a rank above
    `max_rank` (checked before the weights are read), an adapter for another base (more blocks, another width),
    another rank than its config says, a target module the base lacks, tensors missing, NaN or infinite weights,
    a file that is not safetensors."""
    folder = adapter_directory(directory)
    lora = read_adapter_config(folder)
    if max_rank is not None and lora.rank > max_rank:
        raise ValueError(
            f"{folder / ADAPTER_CONFIG_FILE}: r is {lora.rank}, above the largest rank allowed here ({max_rank}); "
            "use an adapter of a smaller rank, or raise the limit (gpt2 serve --max-lora-rank)"
        )
    weights_path = folder / ADAPTER_WEIGHTS_FILE
    if not weights_path.is_file():
        raise FileNotFoundError(f"{weights_path} does not exist; the adapter folder is incomplete, save it again")
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
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
        if not tensor.is_floating_point():
            raise ValueError(f"{weights_path}: tensor {key} holds {tensor.dtype}, not floats; save the adapter again")
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
        a, b = a.float().contiguous(), b.float().contiguous()
        # one NaN or infinity makes every logit of every row decoded with the adapter NaN
        for kind, tensor in (("lora_A", a), ("lora_B", b)):
            if not torch.isfinite(tensor).all():
                raise ValueError(f"{weights_path}: {kind} of {layer} holds NaN or infinite values; save it again")
        layers[layer] = (a, b)
    digest = _digest(lora.scaling, layers)
    return LoRAAdapter(name=name, config=lora, layers=layers, source=folder, given=os.fspath(directory),
                       key=digest)  # fmt: skip


def _digest(scaling: float, layers: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> bytes:
    digest = hashlib.blake2b(repr(scaling).encode(), digest_size=16)
    for layer, (a, b) in sorted(layers.items()):
        digest.update(layer.encode())
        digest.update(a.numpy().tobytes())
        digest.update(b.numpy().tobytes())
    return digest.digest()
