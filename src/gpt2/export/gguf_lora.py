"""GGUF LoRA: a LoRA adapter (PEFT's format) as llama.cpp applies it on a GPT-2 GGUF base
(`llama-cli -m base.gguf --lora adapter.gguf`, `llama-server --lora`).

What goes in, as llama.cpp's adapter loader (src/llama-adapter.cpp) reads it and its convert_lora_to_gguf.py
writes it:

- metadata: `general.architecture = gpt2` (the base's), `general.type = adapter`, `adapter.type = lora`,
  `adapter.lora.alpha`, `general.name`;
- for each adapted weight `blk.N.{attn_qkv, attn_output, ffn_up, ffn_down}.weight`, two tensors named after it
  with `.lora_a` and `.lora_b`: A as the numpy array (r, in) (ggml's {in, r}) and B as (out, r) (ggml's {r, out}),
  so that the loader's checks hold (a's ne[0] = the weight's in, b's ne[1] = its out, a's ne[1] = b's ne[0] = r)
  and it computes W x + (alpha / r) B (A x), PEFT's update. PEFT's A and B are Linear-shaped for GPT-2's Conv1D
  layers too (gpt2.weights.adapters), so they go in untransposed.

llama.cpp scales by alpha / r always; an rsLoRA adapter (alpha / sqrt(r)) is written with alpha * sqrt(r), the
alpha that gives its scaling. Types: f16 (the converter's default) or f32, for both A and B.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpt2.config import GPTConfig
from gpt2.export.llamacpp import write_gguf
from gpt2.runtime.gguf import gguf_package
from gpt2.weights.adapters import read_lora_adapter
from gpt2.weights.gguf import ARCHITECTURE, gguf_tensor_name

GGUF_LORA_DTYPES = ("f16", "f32")  # the converter's default first


def export_gguf_lora(
    config: GPTConfig,
    adapter: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    dtype: str = "f16",
    name: str | None = None,
) -> Path:
    """Write the adapter in the folder `adapter` (PEFT's format, or a LoRA `gpt2 finetune` output folder), checked
    to fit a base model of `config`, as one GGUF LoRA file llama.cpp applies with `--lora PATH`.

    name: `general.name` (default: the file's stem). The file appears only once complete."""
    if dtype not in GGUF_LORA_DTYPES:
        raise ValueError(f"GGUF LoRA dtype {dtype!r} is not supported; choose one of {', '.join(GGUF_LORA_DTYPES)}")
    gguf = gguf_package()
    path = Path(path)
    lora = read_lora_adapter(adapter, config, name or path.stem)
    qtype = gguf.GGMLQuantizationType.F16 if dtype == "f16" else gguf.GGMLQuantizationType.F32
    writer = gguf.GGUFWriter(None, ARCHITECTURE)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_name(lora.name)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, lora.scaling * lora.config.rank)
    for layer, (a, b) in lora.layers.items():
        weight = gguf_tensor_name(f"{layer}.weight")
        for suffix, tensor in (("lora_a", a), ("lora_b", b)):  # (r, in), (out, r)
            data = gguf.quants.quantize(tensor.numpy(), qtype)
            writer.add_tensor(f"{weight}.{suffix}", data, raw_dtype=qtype)
    return write_gguf(writer, path)
