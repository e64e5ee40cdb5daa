"""GPT-2 in GGUF, llama.cpp's format: the tensor names both ways, and `load_gguf`, which reads a `gpt2`-architecture
file as llama.cpp's converter writes it (f32, f16, bf16 and q8_0 tensors; any type `gguf.quants` dequantizes).

A GGUF tensor read as a numpy array (out, in) is ggml's {in, out}: exactly nn.Linear's [out, in], so weights go
in untransposed. Quantized tensors are dequantized to float32 (q8_0: each value its block's scale times its
int8, as llama.cpp computes them); the model is float32 as our other readers return it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.runtime.gguf import gguf_field, gguf_package, open_gguf
from gpt2.weights.empty import empty_model

ARCHITECTURE = "gpt2"

# Our names -> llama.cpp's (llama-arch.cpp, LLM_ARCH_GPT2). Block tensors: transformer.h.{i}.X -> blk.{i}.Y.
TENSOR_NAMES = {
    "transformer.wte.weight": "token_embd.weight",
    "transformer.wpe.weight": "position_embd.weight",
    "transformer.ln_f.weight": "output_norm.weight",
    "transformer.ln_f.bias": "output_norm.bias",
    "lm_head.weight": "output.weight",  # written only when the head is not tied to wte
}
BLOCK_TENSOR_NAMES = {
    "ln_1": "attn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}


def gguf_tensor_name(name: str) -> str:
    """Our parameter name -> llama.cpp's: `transformer.h.3.mlp.c_fc.weight` -> `blk.3.ffn_up.weight`."""
    if name in TENSOR_NAMES:
        return TENSOR_NAMES[name]
    parts = name.split(".")
    if parts[:2] == ["transformer", "h"] and len(parts) >= 5:
        module, leaf = ".".join(parts[3:-1]), parts[-1]
        if module in BLOCK_TENSOR_NAMES:
            return f"blk.{parts[2]}.{BLOCK_TENSOR_NAMES[module]}.{leaf}"
    raise ValueError(f"tensor {name!r} has no place in llama.cpp's GPT-2 layout")


def gguf_config(reader: Any, path: str | os.PathLike[str], **config_overrides: Any) -> GPTConfig:
    """The GPTConfig a `gpt2` GGUF file's metadata describes; anything GPT-2 cannot be is a named error."""
    architecture = gguf_field(reader, "general.architecture")
    if architecture != ARCHITECTURE:
        raise ValueError(f"{path} holds a {architecture!r} model, not GPT-2 ('gpt2'); only GPT-2 GGUF files load here")
    width = int(gguf_field(reader, "gpt2.embedding_length"))
    feed_forward = int(gguf_field(reader, "gpt2.feed_forward_length", 4 * width))
    if feed_forward != 4 * width:
        raise ValueError(f"{path}: feed_forward_length {feed_forward} is not 4 x embedding_length {width} as in GPT-2")
    epsilon = float(gguf_field(reader, "gpt2.attention.layer_norm_epsilon", 1e-5))
    if abs(epsilon - 1e-5) > 1e-9:
        raise ValueError(f"{path}: layer_norm_epsilon {epsilon} is not GPT-2's 1e-5")
    embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise ValueError(f"{path} has no token_embd.weight tensor; it is not a complete GPT-2 GGUF file")
    return GPTConfig(
        n_layer=int(gguf_field(reader, "gpt2.block_count")),
        n_head=int(gguf_field(reader, "gpt2.attention.head_count")),
        n_embd=width,
        block_size=int(gguf_field(reader, "gpt2.context_length")),
        vocab_size=int(embedding.shape[-1]),  # ggml's {C, V}
        **config_overrides,
    )


def load_gguf(path: str | os.PathLike[str], **config_overrides: Any) -> GPT:
    """A float32 GPT from a `gpt2` GGUF file (llama.cpp's converter's layout)."""
    reader = open_gguf(path)
    config = gguf_config(reader, path, **config_overrides)
    dequantize = gguf_package().quants.dequantize
    stored = {tensor.name: tensor for tensor in reader.tensors}
    model = empty_model(config)  # every tensor is about to be overwritten
    ours = {name: p for name, p in model.state_dict().items() if name != "lm_head.weight"}  # tied to wte
    expected = {gguf_tensor_name(name): name for name in ours}
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected) - {"output.weight"})
    if missing or unexpected:
        raise ValueError(f"{path} does not hold GPT-2's tensors: missing {missing[:8]}, unexpected {unexpected[:8]}")
    with torch.no_grad():
        for gguf_name, name in expected.items():
            tensor = stored[gguf_name]
            values = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)  # a writable copy
            if values.size != ours[name].numel():
                raise ValueError(f"{path}: {gguf_name} has {values.size} values, the config needs {ours[name].numel()}")
            ours[name].copy_(torch.from_numpy(values.reshape(ours[name].shape)))
        if "output.weight" in stored:
            head = stored["output.weight"]
            head_values = np.asarray(dequantize(head.data, head.tensor_type), dtype=np.float32)
            if not np.array_equal(head_values.reshape(ours["transformer.wte.weight"].shape),
                                  ours["transformer.wte.weight"].numpy()):  # fmt: skip
                raise ValueError(f"{path}: output.weight differs from token_embd.weight; GPT-2 ties them")
    return model.eval()
