"""karpathy/llm.c's model files (`model_fp32.bin` / `model_bf16.bin`), read.

Layout: a header of 256 little-endian int32 (magic, version, max_t, vocab, n_layer, n_head, n_embd, padded vocab),
then every tensor as nn.Linear [out, in] in llm.c's order, each stacked over the layers, float32 (version 3) or
bfloat16 (version 5). The vocabulary may be padded to Vp rows, which are dropped on load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.weights.empty import empty_model

LLMC_MAGIC = 20240326
LLMC_DTYPES = {3: torch.float32, 5: torch.bfloat16}  # header version -> stored dtype


def load_llmc(path: str | os.PathLike[str], **config_overrides: Any) -> GPT:
    """A GPT from karpathy/llm.c's `model_fp32.bin` / `model_bf16.bin` (weights as nn.Linear [out, in];
    the vocabulary may be padded to Vp rows, which are dropped). Returned in float32."""
    path = Path(path)
    raw = path.read_bytes()
    if len(raw) < 1024:
        raise ValueError(f"{path} is too short ({len(raw)} bytes) to be an llm.c checkpoint (256-int header)")
    header = np.frombuffer(raw[:1024], dtype="<i4")
    magic, version, max_t, vocab, n_layer, n_head, width, padded_vocab = (int(v) for v in header[:8])
    if magic != LLMC_MAGIC or version not in LLMC_DTYPES:
        raise ValueError(f"{path} is not an llm.c GPT-2 checkpoint (magic {magic}, version {version})")
    config = GPTConfig(
        vocab_size=vocab, block_size=max_t, n_layer=n_layer, n_head=n_head, n_embd=width, **config_overrides
    )
    dtype = LLMC_DTYPES[version]
    item = 4 if dtype == torch.float32 else 2
    L, C = n_layer, width
    shapes = [
        ("wte", (padded_vocab, C)), ("wpe", (max_t, C)), ("ln_1.weight", (L, C)), ("ln_1.bias", (L, C)),
        ("attn.c_attn.weight", (L, 3 * C, C)), ("attn.c_attn.bias", (L, 3 * C)),
        ("attn.c_proj.weight", (L, C, C)), ("attn.c_proj.bias", (L, C)),
        ("ln_2.weight", (L, C)), ("ln_2.bias", (L, C)),
        ("mlp.c_fc.weight", (L, 4 * C, C)), ("mlp.c_fc.bias", (L, 4 * C)),
        ("mlp.c_proj.weight", (L, C, 4 * C)), ("mlp.c_proj.bias", (L, C)),
        ("ln_f.weight", (C,)), ("ln_f.bias", (C,)),
    ]  # fmt: skip
    expected = 1024 + item * sum(int(np.prod(shape)) for _, shape in shapes)
    if len(raw) != expected:
        raise ValueError(f"{path} has {len(raw)} bytes; its header describes a {expected}-byte checkpoint")
    payload = torch.frombuffer(bytearray(raw[1024:]), dtype=torch.int16 if item == 2 else torch.float32)
    if item == 2:
        payload = payload.view(torch.bfloat16)
    model = empty_model(config)
    params = dict(model.named_parameters())
    offset = 0
    with torch.no_grad():
        for name, shape in shapes:
            n = int(np.prod(shape))
            tensor = payload[offset : offset + n].view(shape).float()
            offset += n
            if name in ("wte", "wpe"):
                params[f"transformer.{name}.weight"].copy_(tensor[: params[f"transformer.{name}.weight"].shape[0]])
            elif name.startswith("ln_f"):
                params[f"transformer.{name}"].copy_(tensor)
            else:
                for layer in range(L):
                    params[f"transformer.h.{layer}.{name}"].copy_(tensor[layer])
    return model.eval()
