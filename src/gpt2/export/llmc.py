"""llm.c's files: the model checkpoint its trainers load (`train_gpt2 -e FILE`) and `gpt2_tokenizer.bin`.

The model file (read back by `gpt2.weights.load_llmc`), little-endian, no gaps:

- header: 256 int32 = [20240326, version, maxT, V, L, NH, C, Vp, 0, ...]; version 3 = every tensor float32,
  5 = bfloat16 (round to nearest even, the raw 16-bit words). V is the real vocabulary (what llm.c samples
  from and scores), Vp the embedding's rows, padded with zeros to a multiple of 128 for its GPU kernels.
- the tensors as nn.Linear stores them ([out, in]), each kind stacked over the L layers: wte (Vp, C),
  wpe (maxT, C), ln_1.weight (L, C), ln_1.bias (L, C), c_attn.weight (L, 3C, C), c_attn.bias (L, 3C),
  attn.c_proj.weight (L, C, C), attn.c_proj.bias (L, C), ln_2.weight (L, C), ln_2.bias (L, C),
  c_fc.weight (L, 4C, C), c_fc.bias (L, 4C), mlp.c_proj.weight (L, C, 4C), mlp.c_proj.bias (L, C),
  ln_f.weight (C), ln_f.bias (C).

The tokenizer file: header 256 int32 = [20240328, 2, n_tokens, eot_id, 0, ...], then for every id in order one
uint8 length and that many bytes (the token's raw bytes; a special token's text).

>>> from gpt2 import GPT, GPTConfig
>>> from gpt2.tokenizer import load_tokenizer
>>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=50257))
>>> [path.name for path in export_llmc(model, tmp / "gpt2_tiny.bin", tokenizer=load_tokenizer(gpt2_files))]
['gpt2_tiny.bin', 'gpt2_tokenizer.bin']
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from gpt2.export.common import check_tokenizer_fits, float32_tensors, unwrap
from gpt2.model import GPT
from gpt2.runtime.files import atomic_output
from gpt2.tokenizer.protocol import TextTokenizer

MODEL_MAGIC = 20240326
TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2  # version 2 stores the EOT id in the header
HEADER_INTS = 256
VERSION_OF_DTYPE = {"f32": 3, "bf16": 5}
LLMC_DTYPES = tuple(VERSION_OF_DTYPE)
VOCAB_PADDING = 128  # llm.c pads the embedding's rows to a multiple of this
TOKENIZER_FILE = "gpt2_tokenizer.bin"  # the name llm.c's trainers open
MAX_TOKEN_BYTES = 255  # the length is one byte
# Per-layer tensors in the file's order (each stacked over the layers), as our names' suffixes.
LAYER_TENSORS = (
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
)  # fmt: skip


def padded_vocab_size(vocab_size: int) -> int:
    """Rows of llm.c's embedding: `vocab_size` rounded up to a multiple of 128 (50257 -> 50304)."""
    return -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING


def _write_array(file: BinaryIO, array: np.ndarray, dtype: str) -> None:
    if dtype == "bf16":  # torch rounds to nearest even; numpy has no bfloat16, so write the 16-bit words
        words = torch.from_numpy(np.ascontiguousarray(array)).to(torch.bfloat16).view(torch.int16).numpy()
        file.write(words.astype("<i2", copy=False).tobytes())
    else:
        file.write(np.ascontiguousarray(array, dtype="<f4").tobytes())


def export_llmc(
    model: GPT,
    path: str | os.PathLike[str],
    *,
    dtype: str = "f32",
    tokenizer: TextTokenizer | None = None,
    tokenizer_path: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """Write `model` as an llm.c checkpoint, and the tokenizer (when given) as llm.c's tokenizer file, by
    default `gpt2_tokenizer.bin` beside it. Returns the paths written; each appears only once complete.

    dtype: 'f32' (version 3, what llm.c's CPU trainer train_gpt2.c reads) or 'bf16' (version 5, its CUDA
    trainer's default). With a tokenizer smaller than the model (a vocabulary padded for speed), V in the header
    is the tokenizer's size, so llm.c never samples an id it cannot decode.
    """
    if dtype not in VERSION_OF_DTYPE:
        raise ValueError(f"llm.c dtype {dtype!r} is not supported; choose one of {', '.join(LLMC_DTYPES)}")
    model = unwrap(model)
    config = model.config
    arrays = float32_tensors(model)
    if "lm_head.weight" in arrays:
        raise ValueError("llm.c ties the output head to wte, but this model's lm_head differs from its wte")
    vocab_size = config.vocab_size
    if tokenizer is not None:
        check_tokenizer_fits(model, tokenizer)
        vocab_size = len(tokenizer)
    wte = arrays["transformer.wte.weight"]  # (V_model, C)
    padded = padded_vocab_size(config.vocab_size)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [MODEL_MAGIC, VERSION_OF_DTYPE[dtype], config.block_size, vocab_size, config.n_layer,
                  config.n_head, config.n_embd, padded]  # fmt: skip

    path = Path(path)
    tokenizer_path = Path(tokenizer_path or path.parent / TOKENIZER_FILE)
    if tokenizer is not None and tokenizer_path.resolve() == path.resolve():
        raise ValueError(f"--out {path} is where llm.c's tokenizer file goes; name the model file otherwise")
    written = [path]
    with atomic_output(path) as temporary, open(temporary, "wb") as file:
        file.write(header.tobytes())
        _write_array(file, np.pad(wte, ((0, padded - wte.shape[0]), (0, 0))), dtype)  # (Vp, C), zero rows
        _write_array(file, arrays["transformer.wpe.weight"], dtype)  # (maxT, C)
        for suffix in LAYER_TENSORS:
            for layer in range(config.n_layer):
                _write_array(file, arrays[f"transformer.h.{layer}.{suffix}"], dtype)
        _write_array(file, arrays["transformer.ln_f.weight"], dtype)
        _write_array(file, arrays["transformer.ln_f.bias"], dtype)
    if tokenizer is not None:
        written.append(write_llmc_tokenizer(tokenizer, tokenizer_path))
    return written


def write_llmc_tokenizer(tokenizer: TextTokenizer, path: str | os.PathLike[str]) -> Path:
    """Write llm.c's tokenizer file (version 2: with the EOT id), which its trainers use to print samples."""
    try:
        eot = tokenizer.eot_token
    except ValueError as err:
        raise ValueError(f"llm.c's tokenizer file needs an end-of-text token: {err}") from err
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = [TOKENIZER_MAGIC, TOKENIZER_VERSION, len(tokenizer), eot]
    records = [header.tobytes()]
    for token_id in range(len(tokenizer)):
        raw = tokenizer.decode_bytes([token_id])
        if not 0 < len(raw) <= MAX_TOKEN_BYTES:
            raise ValueError(
                f"token {token_id} is {len(raw)} bytes long; llm.c's tokenizer file stores 1 to "
                f"{MAX_TOKEN_BYTES} bytes per token"
            )
        records.append(bytes([len(raw)]) + raw)
    path = Path(path)
    with atomic_output(path) as temporary:
        temporary.write_bytes(b"".join(records))
    return path
