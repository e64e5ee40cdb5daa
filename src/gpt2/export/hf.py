"""The Hugging Face layout: config.json + model.safetensors (`gpt2.weights.save_pretrained`) with the tokenizer
saved beside them, so `transformers`, `LLM.load` and every tool that reads a GPT-2 directory can use it."""

from __future__ import annotations

import os
from pathlib import Path

from gpt2.export.common import check_tokenizer_fits, unwrap
from gpt2.model import GPT
from gpt2.runtime.files import atomic_directory
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.weights import save_pretrained

HF_DTYPES = ("f32",)  # save_pretrained writes float32 (its config.json says so)


def export_hf(model: GPT, tokenizer: TextTokenizer, directory: str | os.PathLike[str]) -> Path:
    """Write the model and its tokenizer into `directory`. Everything is written into a temporary folder beside
    it first: a new directory appears complete or not at all; into an existing one each file is moved whole."""
    model = unwrap(model)
    check_tokenizer_fits(model, tokenizer)
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"--out {directory} is a file; the HF format is a directory")
    with atomic_directory(directory) as staging:
        save_pretrained(model, staging)
        tokenizer.save(staging)
    return directory
