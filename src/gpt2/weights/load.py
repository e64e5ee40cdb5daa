"""One entry point for every checkpoint format: `load_model` looks at the path and picks the reader."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpt2.model import GPT
from gpt2.runtime.gguf import is_gguf
from gpt2.weights.gguf import load_gguf
from gpt2.weights.hf import load_hf
from gpt2.weights.llmc import load_llmc
from gpt2.weights.openai_tf import load_openai_tf


def load_model(path: str | os.PathLike[str], **config_overrides: Any) -> GPT:
    """Load whichever GPT-2 format `path` holds: a HF directory (or Hub name such as "gpt2", when online),
    OpenAI's TF release directory, an llm.c `.bin` file, or a GGUF file of llama.cpp's (f32/f16/bf16/q8_0,
    dequantized). `config_overrides` change fields such as dropout or attn_impl. The model is returned on the CPU
    in eval mode."""
    local = Path(path).expanduser()
    if is_gguf(local):
        return load_gguf(local, **config_overrides)
    if local.is_file():
        return load_llmc(local, **config_overrides)
    if local.is_dir() and not (local / "config.json").exists() and (local / "hparams.json").exists():
        return load_openai_tf(local, **config_overrides)
    return load_hf(path, **config_overrides)
