"""The HuggingFace GPT-2 layout, read and written: what `transformers` and the Hub use.

A directory with `config.json` and the weights in `model.safetensors`, sharded `model-0000N-of-0000M.safetensors`
+ `model.safetensors.index.json`, or a legacy `pytorch_model.bin` (read with `torch.load(weights_only=True)`,
which cannot run code). Keys are ours (`transformer.h.0.attn.c_attn.weight`, ...) with or without the
`transformer.` prefix. The linear layers are stored as OpenAI's "Conv1D": weight [in, out], the transpose of
`nn.Linear`'s [out, in]. `to_hf_tensor` / `from_hf_tensor` are the one place that transposes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.runtime.files import atomic_write_bytes
from gpt2.weights.empty import empty_model
from gpt2.weights.hub import resolve_pretrained

# Weights of these modules are Conv1D ([in, out]) in HF/OpenAI files and nn.Linear ([out, in]) here.
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Non-parameter buffers older transformers versions saved (the causal mask); they carry no information.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
# GELU variants in HF configs that are the tanh form GPT-2 uses.
TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
HF_FILES = ("config.json", "*.safetensors", "model.safetensors.index.json")


def _is_conv1d(name: str) -> bool:
    return name.endswith(CONV1D_SUFFIXES)


def from_hf_tensor(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A tensor from a HF/OpenAI file as our parameter `name` holds it (Conv1D [in, out] -> Linear [out, in])."""
    return tensor.t() if _is_conv1d(name) else tensor


def to_hf_tensor(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Our parameter as a HF file stores it (Linear [out, in] -> Conv1D [in, out])."""
    return tensor.t() if _is_conv1d(name) else tensor


# --------------------------------------------------------------------------------------- config
def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> GPTConfig:
    """GPTConfig from a HF GPT-2 config.json; refuses variants this model does not compute."""
    model_type = hf.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise ValueError(f"config.json has model_type {model_type!r}; only 'gpt2' checkpoints can be loaded")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in TANH_GELU_NAMES:
        raise ValueError(f"config.json activation_function {activation!r} is not GPT-2's tanh GELU {TANH_GELU_NAMES}")
    unsupported = {
        "scale_attn_weights": (True, hf.get("scale_attn_weights", True)),
        "scale_attn_by_inverse_layer_idx": (False, hf.get("scale_attn_by_inverse_layer_idx", False)),
        "reorder_and_upcast_attn": (False, hf.get("reorder_and_upcast_attn", False)),
        "tie_word_embeddings": (True, hf.get("tie_word_embeddings", True)),
    }
    for key, (expected, value) in unsupported.items():
        if value != expected:
            raise ValueError(f"config.json sets {key}={value!r}; this GPT-2 implementation supports only {expected!r}")
    try:
        values: dict[str, Any] = dict(
            vocab_size=hf["vocab_size"],
            block_size=hf.get("n_positions", hf.get("n_ctx")),
            n_layer=hf["n_layer"],
            n_head=hf["n_head"],
            n_embd=hf["n_embd"],
            layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            bias=True,
        )
    except KeyError as err:
        raise ValueError(f"config.json lacks the GPT-2 field {err.args[0]!r}") from err
    values.update(overrides)
    return GPTConfig(**values)


def config_to_hf(config: GPTConfig) -> dict[str, Any]:
    """A config.json that `transformers.GPT2LMHeadModel` reads as the same model."""
    eos = 50256 if config.vocab_size > 50256 else config.vocab_size - 1
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_ctx": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "use_cache": True,
        "torch_dtype": "float32",
    }


# ------------------------------------------------------------------------------------- reading
def read_hf_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF-format directory as stored (names and layout untouched)."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    legacy = directory / "pytorch_model.bin"
    if single.is_file():
        return _read_safetensors(single)
    if index.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise ValueError(f"{index} is not a safetensors index (needs a 'weight_map'): {err}") from err
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if not (directory / shard).is_file():
                raise FileNotFoundError(f"{index} names shard {shard!r}, which is missing from {directory}")
            tensors.update(_read_safetensors(directory / shard))
        return tensors
    if legacy.is_file():
        # weights_only=True: a pickle that tries to build anything but tensors is refused, never executed.
        try:
            return torch.load(legacy, map_location="cpu", weights_only=True)
        except Exception as err:
            raise ValueError(f"{legacy} could not be read as plain tensors (refused: {err})") from err
    raise FileNotFoundError(
        f"no weights in {directory}: expected model.safetensors, model.safetensors.index.json + shards, "
        "or pytorch_model.bin"
    )


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """One safetensors file; a truncated or corrupt one is a one-line error naming it (safetensors never runs
    code, but its own exception reads like a crash)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(
            f"{path} is not a readable safetensors file ({err}); it is truncated or corrupt: download or save it again"
        ) from err


def load_hf_state_dict(model: GPT, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy HF-layout tensors into `model`, transposing Conv1D weights; every mismatch is a named error."""
    ours = {name: p for name, p in model.state_dict().items() if name != "lm_head.weight"}  # tied to wte
    found: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for key, tensor in tensors.items():
        if key.endswith(IGNORED_SUFFIXES) or key == "lm_head.weight":
            continue  # causal-mask buffers; the head is tied to wte (checked below when present)
        name = key if key.startswith("transformer.") else f"transformer.{key}"
        if name not in ours:
            unexpected.append(key)
            continue
        found[name] = from_hf_tensor(name, tensor)
    missing = sorted(set(ours) - set(found))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"unexpected tensors: {sorted(unexpected)[:8]}{' ...' if len(unexpected) > 8 else ''}")
        raise ValueError("checkpoint does not match the GPT-2 config: " + "; ".join(parts))
    for name, tensor in found.items():
        if tensor.shape != ours[name].shape:
            stored = tuple(to_hf_tensor(name, tensor).shape)
            raise ValueError(
                f"tensor {name} has shape {stored} in the checkpoint but the config needs "
                f"{tuple(to_hf_tensor(name, ours[name]).shape)}"
            )
    head = tensors.get("lm_head.weight")
    if head is not None and not torch.equal(head, found["transformer.wte.weight"]):
        raise ValueError("lm_head.weight differs from wte.weight; GPT-2 ties them and untied heads are unsupported")
    with torch.no_grad():
        for name, tensor in found.items():
            ours[name].copy_(tensor)


def load_hf(name_or_path: str | os.PathLike[str], **config_overrides: Any) -> GPT:
    """A GPT from a HF-format directory or Hub name. See the module docstring for the accepted layouts."""
    directory = resolve_pretrained(name_or_path, allow_patterns=HF_FILES)
    config_path = directory / "config.json"
    if not config_path.is_file():
        found = "it is empty" if not any(directory.iterdir()) else "it has no config.json"
        raise FileNotFoundError(
            f"{directory} is not a GPT-2 checkpoint ({found}): expected a HF-format directory (config.json + "
            "model.safetensors), OpenAI's release (hparams.json + model.ckpt.*), an llm.c .bin or a GGUF file"
        )
    try:
        hf_config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from err
    if not isinstance(hf_config, dict):
        raise ValueError(f"{config_path} must hold a JSON object, got {type(hf_config).__name__}")
    try:
        config = config_from_hf(hf_config, **config_overrides)
    except ValueError as err:
        raise ValueError(f"{config_path}: {err}") from err
    tensors = read_hf_state_dict(directory)
    model = empty_model(config)  # every tensor is about to be overwritten
    load_hf_state_dict(model, tensors)
    return model.eval()


# ------------------------------------------------------------------------------------- writing
def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under HF names and layout (no lm_head: transformers ties it to wte on load). A model built
    with bias=False gets zero biases, which computes the same function in GPT-2's biased layout."""
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        tensors[name] = to_hf_tensor(name, tensor.detach()).contiguous().cpu()
    if not model.config.bias:
        for name, module in model.named_modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) and name != "lm_head":
                tensors[f"{name}.bias"] = torch.zeros(module.weight.shape[0], dtype=module.weight.dtype)
    return tensors


def save_pretrained(model: GPT, directory: str | os.PathLike[str]) -> None:
    """config.json + model.safetensors in the HF GPT-2 layout; each file written atomically."""
    from safetensors.torch import save

    model = getattr(model, "_orig_mod", model)  # a torch.compile wrapper saves its module's names
    model = getattr(model, "module", model)  # likewise DDP
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(directory / "model.safetensors", save(hf_state_dict(model), metadata={"format": "pt"}))
    atomic_write_bytes(directory / "config.json", (json.dumps(config_to_hf(model.config), indent=2) + "\n").encode())
